//! The native module `kvgate._kvgate` behind the Python package `kvgate`: the simulator's runs (`agents`,
//! `replay`, `scenario`) and the engine as a scheduler drives it (`Engine`), over the facade crate. Reports
//! come back as plain Python data (dicts, lists, numbers, strings) built from the same JSON the command
//! line prints; errors come back as the exception classes of `kvgate.errors`. The pure-Python package
//! checks argument types and calls these; nothing here is meant to be imported on its own.

mod convert;
mod engine;
mod errors;
mod kv_events;
mod options;
mod runs;

use pyo3::prelude::*;

/// The module: three run functions, the `Engine` class and the crate's version.
#[pymodule]
fn _kvgate(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(runs::agents, module)?)?;
    module.add_function(wrap_pyfunction!(runs::replay, module)?)?;
    module.add_function(wrap_pyfunction!(runs::scenario, module)?)?;
    module.add_class::<engine::PyEngine>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
