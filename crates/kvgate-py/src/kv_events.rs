//! `Engine.take_kv_events`: the engine's KV events as dicts with vLLM's field names, in vLLM's order, after
//! a `type` tag naming the event (msgspec's tag field), block hashes as `bytes` (`kvgate::KvEvent`).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use kvgate::BlockKey;
use kvgate::KvEvent;

/// `hashes` as a list of `bytes`.
pub(crate) fn hash_list<'py>(py: Python<'py>, hashes: &[BlockKey]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, hashes.iter().map(|hash| PyBytes::new(py, &hash.0)))
}

/// One event as vLLM's fields: `type`, then its struct's fields in their order.
pub(crate) fn event_dict<'py>(py: Python<'py>, event: &KvEvent) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("type", event.name())?;
    match event {
        KvEvent::BlockStored(stored) => {
            dict.set_item("block_hashes", hash_list(py, &stored.block_hashes)?)?;
            let parent = stored
                .parent_block_hash
                .map(|hash| PyBytes::new(py, &hash.0));
            dict.set_item("parent_block_hash", parent)?;
            dict.set_item("token_ids", &stored.token_ids)?;
            dict.set_item("block_size", stored.block_size)?;
            dict.set_item("lora_id", stored.lora_id)?;
            dict.set_item("medium", stored.medium)?;
            dict.set_item("lora_name", &stored.lora_name)?;
            dict.set_item("extra_keys", &stored.extra_keys)?;
            dict.set_item("group_idx", stored.group_idx)?;
            dict.set_item("kv_cache_spec_kind", stored.kv_cache_spec_kind)?;
            dict.set_item(
                "kv_cache_spec_sliding_window",
                stored.kv_cache_spec_sliding_window,
            )?;
        }
        KvEvent::BlockRemoved(removed) => {
            dict.set_item("block_hashes", hash_list(py, &removed.block_hashes)?)?;
            dict.set_item("medium", removed.medium)?;
            dict.set_item("group_idx", removed.group_idx)?;
        }
        KvEvent::AllBlocksCleared => {}
    }
    Ok(dict)
}

/// `events` as a list of dicts.
pub(crate) fn event_list<'py>(py: Python<'py>, events: &[KvEvent]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for event in events {
        list.append(event_dict(py, event)?)?;
    }
    Ok(list)
}
