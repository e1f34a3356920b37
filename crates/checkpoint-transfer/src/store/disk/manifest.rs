//! The manifest file format. A bincode header (magic, format version, body length), the bincode body
//! (`ManifestBody`: the checkpoint's metadata, payload size, BLAKE3 of every page) and the BLAKE3 of the
//! header and body together, so damaged metadata is noticed before anything is decoded from it. Decoding is
//! size-limited, never trusts a length it has not checked, and says why a file is unusable.

use serde::{Deserialize, Serialize};

use crate::checkpoint::CheckpointMeta;

/// Manifest format this build writes and reads (2: the manifest carries a checksum of its own bytes).
pub const MANIFEST_FORMAT_VERSION: u32 = 2;

/// Largest manifest accepted, in bytes: a hostile file cannot make decoding allocate more.
pub const MANIFEST_BYTES_MAX: usize = 16 << 20;

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
