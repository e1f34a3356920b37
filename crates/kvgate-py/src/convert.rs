//! JSON values to Python objects and back: every report is built as the JSON the command line prints and
//! handed over as dicts and lists; a config given as a dict comes in as JSON and goes on as TOML.

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// `value` as a Python object: objects become dicts, arrays lists, numbers ints or floats.
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match value {
        Value::Null => Ok(py.None().into_bound(py)),
        Value::Bool(flag) => flag.into_bound_py_any(py),
        Value::Number(number) => number_to_py(py, number),
        Value::String(text) => text.into_bound_py_any(py),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            Ok(list.into_any())
        }
        Value::Object(fields) => {
            let dict = PyDict::new(py);
            for (key, item) in fields {
                dict.set_item(key, to_py(py, item)?)?;
            }
            Ok(dict.into_any())
        }
    }
}

fn number_to_py<'py>(py: Python<'py>, number: &Number) -> PyResult<Bound<'py, PyAny>> {
    if let Some(unsigned) = number.as_u64() {
        unsigned.into_bound_py_any(py)
    } else if let Some(signed) = number.as_i64() {
        signed.into_bound_py_any(py)
    } else {
        number.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)
    }
}

/// Nesting deeper than this in a config dict is refused (a config is two levels deep).
const DEPTH_MAX: usize = 32;

/// A Python value (dicts with string keys, lists, tuples, strings, bools, ints, floats) as JSON; anything
/// else is a `TypeError` naming where it sits (`what`).
pub(crate) fn from_py(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    from_py_at(value, what, 0)
}

fn from_py_at(value: &Bound<'_, PyAny>, what: &str, depth: usize) -> PyResult<Value> {
    if depth > DEPTH_MAX {
        return Err(PyTypeError::new_err(format!(
            "{what}: nested more than {DEPTH_MAX} levels deep"
        )));
    }
    if value.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{what} is None: leave the field out to take its default"
        )));
    }
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(unsigned) = value.extract::<u64>() {
            return Ok(Value::from(unsigned));
        }
        let signed: i64 = value.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what}: the integer {value} does not fit in 64 bits"
            ))
        })?;
        return Ok(Value::from(signed));
    }
    if let Ok(float) = value.cast::<PyFloat>() {
        let float = float.value();
        return Number::from_f64(float).map(Value::Number).ok_or_else(|| {
            PyTypeError::new_err(format!("{what}: {float} is not a finite number"))
        });
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Value::String(text.to_cow()?.into_owned()));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut fields = Map::new();
        for (key, item) in dict.iter() {
            let key: String = key.extract().map_err(|_| {
                PyTypeError::new_err(format!("{what}: keys must be strings, not {key:?}"))
            })?;
            let inner = format!("{what}[{key:?}]");
            fields.insert(key, from_py_at(&item, &inner, depth + 1)?);
        }
        return Ok(Value::Object(fields));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (idx, item) in value.try_iter()?.enumerate() {
            items.push(from_py_at(&item?, &format!("{what}[{idx}]"), depth + 1)?);
        }
        return Ok(Value::Array(items));
    }
    let type_name = value.get_type().name()?;
    Err(PyTypeError::new_err(format!(
        "{what}: a {type_name} cannot be part of a config; use dicts, lists, strings, bools and numbers"
    )))
}
