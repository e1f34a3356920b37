//! The manifest format both persistent tiers write (`DiskStore` files, `RedisStore` values). A bincode header (magic, format version, body length), the bincode body
//! (`ManifestBody`: the checkpoint's metadata, payload size, BLAKE3 of every page) and the BLAKE3 of the
//! header and body together, so damaged metadata is noticed before anything is decoded from it. Decoding is
//! size-limited, never trusts a length it has not checked, and says why a file is unusable.

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointMeta, CheckpointPayload, push_hex};
use crate::page_buf::RankPages;

/// Manifest format this build writes and reads (2: the manifest carries a checksum of its own bytes; 3: an
/// auxiliary group's kind carries its pages per request).
pub(crate) const MANIFEST_FORMAT_VERSION: u32 = 3;

/// Largest manifest accepted, in bytes: a hostile file cannot make decoding allocate more.
pub(crate) const MANIFEST_BYTES_MAX: usize = 16 << 20;

const MANIFEST_MAGIC: [u8; 8] = *b"KVGATECK";
const CHECKSUM_BYTES: usize = 32;

/// What a manifest says about its checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ManifestBody {
    pub(crate) meta: CheckpointMeta,
    pub(crate) payload_bytes: u64,
    /// BLAKE3 of every page, rank-major (rank 0's pages first).
    pub(crate) page_checksums: Vec<[u8; 32]>,
}

impl ManifestBody {
    /// Checks that the page checksums and payload size agree with the pages the metadata lists (without
    /// overflowing on hostile counts); the reason otherwise.
    pub(crate) fn check_shape(&self) -> Result<(), String> {
        let layout = &self.meta.layout;
        let n_checksums = (self.meta.pages.len() as u64).checked_mul(u64::from(layout.n_ranks));
        let n_bytes = n_checksums.and_then(|n| n.checked_mul(layout.bytes_per_page));
        if n_checksums != Some(self.page_checksums.len() as u64)
            || n_bytes != Some(self.payload_bytes)
            || usize::try_from(self.payload_bytes).is_err()
        {
            return Err("manifest's checksums or payload size do not match its pages".to_string());
        }
        Ok(())
    }
}

/// The manifest file's bytes for `body`.
pub(crate) fn encode(body: &ManifestBody) -> Result<Vec<u8>, String> {
    let body = bincode::serde::encode_to_vec(body, bincode::config::standard())
        .map_err(|e| format!("cannot encode manifest: {e}"))?;
    seal(MANIFEST_FORMAT_VERSION, &body)
}

/// Header, `body` and the checksum of both.
pub(crate) fn seal(format_version: u32, body: &[u8]) -> Result<Vec<u8>, String> {
    let header = (MANIFEST_MAGIC, format_version, body.len() as u64);
    let mut bytes = bincode::serde::encode_to_vec(header, bincode::config::standard())
        .map_err(|e| format!("cannot encode manifest header: {e}"))?;
    bytes.extend_from_slice(body);
    let checksum = blake3::hash(&bytes);
    bytes.extend_from_slice(checksum.as_bytes());
    Ok(bytes)
}

/// Decodes and verifies a manifest file; the reason it is unusable otherwise.
pub(crate) fn decode(bytes: &[u8]) -> Result<ManifestBody, String> {
    let config = bincode::config::standard().with_limit::<MANIFEST_BYTES_MAX>();
    let describe = |e: bincode::error::DecodeError| match e {
        bincode::error::DecodeError::UnexpectedEnd { .. } => {
            format!("truncated manifest ({} bytes): {e}", bytes.len())
        }
        other => format!("undecodable manifest: {other}"),
    };
    // Magic and version first: a foreign file or another format is named as such.
    let ((magic, format_version), _): (([u8; 8], u32), usize) =
        bincode::serde::decode_from_slice(bytes, config).map_err(describe)?;
    if magic != MANIFEST_MAGIC {
        return Err("not a kvgate checkpoint manifest (foreign file)".to_string());
    }
    if format_version != MANIFEST_FORMAT_VERSION {
        return Err(format!(
            "manifest format version {format_version}, this build reads {MANIFEST_FORMAT_VERSION}"
        ));
    }
    let ((_, _, body_len), header_len): (([u8; 8], u32, u64), usize) =
        bincode::serde::decode_from_slice(bytes, config).map_err(describe)?;
    let expected_len = usize::try_from(body_len)
        .ok()
        .and_then(|body_len| body_len.checked_add(header_len + CHECKSUM_BYTES));
    match expected_len {
        Some(len) if len == bytes.len() => {}
        Some(len) if len > bytes.len() => {
            return Err(format!(
                "truncated manifest ({} bytes, its header says {len})",
                bytes.len()
            ));
        }
        Some(len) => {
            return Err(format!("manifest has {} trailing bytes", bytes.len() - len));
        }
        None => {
            return Err(format!(
                "truncated manifest ({} bytes, its header says {body_len} more)",
                bytes.len()
            ));
        }
    }
    let (sealed, checksum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if blake3::hash(sealed).as_bytes() != checksum {
        return Err(
            "manifest fails its checksum: its metadata is damaged, the checkpoint is skipped"
                .to_string(),
        );
    }
    let body = &sealed[header_len..];
    let (manifest, n_read): (ManifestBody, usize) =
        bincode::serde::decode_from_slice(body, config).map_err(describe)?;
    if n_read != body.len() {
        return Err(format!(
            "manifest body has {} trailing bytes",
            body.len() - n_read
        ));
    }
    manifest.check_shape()?;
    Ok(manifest)
}

impl ManifestBody {
    /// The manifest of `checkpoint`, with the BLAKE3 of every page (rank-major).
    pub(crate) fn of(checkpoint: &Checkpoint) -> Self {
        let page_checksums = checkpoint
            .payload
            .ranks
            .iter()
            .flat_map(RankPages::pages)
            .map(|page| *blake3::hash(page).as_bytes())
            .collect();
        Self {
            meta: checkpoint.meta.clone(),
            payload_bytes: checkpoint.payload.n_bytes(),
            page_checksums,
        }
    }

    /// Splits a payload read back into its ranks' pages, verifying its size and every page's checksum
    /// against this manifest (G6); the reason it is unusable otherwise.
    pub(crate) fn verify_payload(&self, bytes: &[u8]) -> Result<CheckpointPayload, String> {
        if bytes.len() as u64 != self.payload_bytes {
            return Err(format!(
                "payload is {} bytes, the manifest says {}",
                bytes.len(),
                self.payload_bytes
            ));
        }
        let layout = &self.meta.layout;
        let n_pages = self.meta.pages.len();
        let mut ranks = Vec::with_capacity(layout.n_ranks as usize);
        let bytes_per_page = (layout.bytes_per_page as usize).max(1);
        let mut chunks = bytes.chunks_exact(bytes_per_page);
        for rank in 0..layout.n_ranks as usize {
            let mut pages: Vec<&[u8]> = Vec::with_capacity(n_pages);
            for page_idx in 0..n_pages {
                let flat_idx = rank * n_pages + page_idx;
                let page = chunks.next().unwrap_or_default();
                if Some(blake3::hash(page).as_bytes()) != self.page_checksums.get(flat_idx) {
                    return Err(format!("page {page_idx} of rank {rank} fails its checksum"));
                }
                pages.push(page);
            }
            ranks.push(RankPages::from_pages(pages, bytes_per_page));
        }
        Ok(CheckpointPayload { ranks })
    }
}

/// Hex of the id's bytes after `ckpt-`: only `[0-9a-f]`, so a file name can never leave its directory and a
/// key never holds a separator.
pub(crate) fn id_stem(id: &CheckpointId) -> String {
    let mut stem = String::with_capacity(id.as_str().len() * 2 + 5);
    stem.push_str("ckpt-");
    push_hex(&mut stem, id.as_str().as_bytes());
    stem
}
