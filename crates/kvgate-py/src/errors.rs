//! Rust errors as Python exceptions, one class per kind (`kvgate.errors`): `PressureError` (the engine is
//! short of memory or made no progress: retry later or with a smaller load), `ImpossibleError` (the request
//! can never run on this engine), `InvalidError` (a bad argument, config or file; also a `ValueError`) and
//! `InternalError` (a bug in kvgate). The message is the Rust error's. A missing file is a
//! `FileNotFoundError`, an interrupted run a `KeyboardInterrupt`.

use pyo3::exceptions::{PyFileNotFoundError, PyKeyboardInterrupt, PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use kvgate::workload::mooncake::TraceError;
use kvgate::{EngineError, Error, PoolError, TransferError};

/// The kind of an error, as the name of its class in `kvgate.errors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Pressure,
    Impossible,
    Invalid,
    Internal,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Pressure => "PressureError",
            Kind::Impossible => "ImpossibleError",
            Kind::Invalid => "InvalidError",
            Kind::Internal => "InternalError",
        }
    }
}

/// The exception of class `kind` (from `kvgate.errors`) carrying `message`.
pub(crate) fn raise(py: Python<'_>, kind: Kind, message: &str) -> PyErr {
    let class = py
        .import("kvgate.errors")
        .and_then(|module| module.getattr(kind.class_name()));
    match class.and_then(|class| class.call1((message,))) {
        Ok(exception) => PyErr::from_value(exception),
        // The package is not importable (the native module loaded on its own): still an exception.
        Err(_) => PyRuntimeError::new_err(format!("{}: {message}", kind.class_name())),
    }
}

/// A facade error as its Python exception.
pub(crate) fn facade(py: Python<'_>, error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::Interrupted => PyKeyboardInterrupt::new_err(message),
        Error::ReadFile { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(message)
        }
        Error::ReadFile { .. } => PyOSError::new_err(message),
        Error::Trace(TraceError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            PyFileNotFoundError::new_err(message)
        }
        Error::Trace(TraceError::Io { .. }) => PyOSError::new_err(message),
        Error::Engine(engine) => raise(py, engine_kind(&engine), &message),
        Error::Internal(_) => raise(py, Kind::Internal, &message),
        Error::Incomplete { .. } => raise(py, Kind::Pressure, &message),
        _ => raise(py, Kind::Invalid, &message),
    }
}

/// An engine error as its Python exception.
pub(crate) fn engine(py: Python<'_>, error: &EngineError) -> PyErr {
    raise(py, engine_kind(error), &error.to_string())
}

/// The kind of an engine error: what a caller does about it.
pub(crate) fn engine_kind(error: &EngineError) -> Kind {
    match error {
        EngineError::Stalled { .. }
        | EngineError::ResetRefusedImports { .. }
        | EngineError::ResetRefusedPagesInUse { .. } => Kind::Pressure,
        EngineError::Rejected { .. } => Kind::Impossible,
        EngineError::InvalidParam { .. }
        | EngineError::UnsupportedGeometry { .. }
        | EngineError::UnknownPolicy { .. }
        | EngineError::DuplicateRequest { .. }
        | EngineError::EmptyPrompt { .. }
        | EngineError::UnknownRequest { .. }
        | EngineError::NotPaused { .. } => Kind::Invalid,
        EngineError::Pool(pool) => pool_kind(pool),
        EngineError::Transfer(transfer) => transfer_kind(transfer),
        _ => Kind::Internal,
    }
}

fn pool_kind(error: &PoolError) -> Kind {
    match error {
        PoolError::OutOfPages { .. } | PoolError::PagesInUse { .. } => Kind::Pressure,
        PoolError::PoolTooSmall { .. } => Kind::Impossible,
        PoolError::DoubleFree { .. } | PoolError::CudaFailed { .. } => Kind::Internal,
        _ => Kind::Invalid,
    }
}

fn transfer_kind(error: &TransferError) -> Kind {
    match error {
        TransferError::TooLarge { .. } => Kind::Impossible,
        TransferError::Invalid(_)
        | TransferError::Mismatch { .. }
        | TransferError::StoreDir { .. }
        | TransferError::Locked { .. } => Kind::Invalid,
        TransferError::Write { .. } | TransferError::Remote { .. } => Kind::Pressure,
        _ => Kind::Internal,
    }
}
