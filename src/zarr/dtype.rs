//! The one data-type model: every `data_type` that zarr-python (3.1 and 3.4) and
//! tensorstore write into a Zarr v3 `zarr.json`, with its item size (the bytes one element
//! takes in a chunk after the `bytes` codec) and the fill values a reader takes for it.
//! Everything that needs a size or judges a fill value asks here (the mount's transparent
//! compression, chunk sizes, shard planning, `verify`).
//!
//! Types, as the writers name them:
//! - core: `bool`, `int8`..`int64`, `uint8`..`uint64`, `float16`/`32`/`64`, `complex64`/
//!   `128`, `rN` (raw bits, N a multiple of 8);
//! - tensorstore's: `int2`, `int4` (one byte each), `bfloat16`, the `float8_*` family;
//! - zarr-python's: `numpy.datetime64`, `numpy.timedelta64` (8 bytes),
//!   `null_terminated_bytes`, `fixed_length_utf32` and `raw_bytes` (`length_bytes` each),
//!   `structured` (3.1) and `struct` (3.4) (the sum of their fields), and the variable-size
//!   `string` and `variable_length_bytes` (no item size).

use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DataTypeError {
    #[error("data_type {0} is none that zarr-python or tensorstore reads")]
    Unknown(String),
    #[error("data_type {name}: {reason}")]
    BadConfiguration { name: String, reason: String },
    #[error("fill_value {value} is not a {name}{why}")]
    BadFill {
        value: String,
        name: String,
        why: String,
    },
}

/// What a fill value of a type may be.
#[derive(Clone, Debug, PartialEq)]
enum Fill {
    Bool,
    /// An integer in this range.
    Int {
        min: i128,
        max: i128,
    },
    /// A number, "NaN", "Infinity", "-Infinity", or "0x" and the raw bits in hex (this
    /// many bytes of them).
    Float(u64),
    /// Two floats of this many bytes each (`Fill::Float`).
    Complex(u64),
    /// `n` bytes: an array of `n` integers 0..255 (raw bits).
    ByteArray(u64),
    /// A string (text, or bytes written as base64 by zarr-python).
    Text,
    /// An integer of int64, or "NaT".
    Time,
    /// A base64 string, or an object of the fields' fill values (zarr-python 3.4).
    Structured,
}

/// A data type: its name as written and what the `bytes` codec makes of one element.
#[derive(Clone, Debug, PartialEq)]
pub struct DataType {
    pub name: String,
    /// Bytes per element; `None` for variable-size types.
    pub item_size: Option<u64>,
    fill: Fill,
}

impl DataType {
    /// The data type of a `zarr.json`'s `data_type` field.
    pub fn of(v: &Value) -> Result<DataType, DataTypeError> {
        match v {
            Value::String(name) => named(name),
            Value::Object(o) => {
                let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
                configured(name, o.get("configuration"))
            }
            other => Err(DataTypeError::Unknown(other.to_string())),
        }
    }

    /// Why the array may not be sharded, if a reader or writer cannot take it sharded:
    /// zarr-python 3.1 fails on sharded arrays of `raw_bytes` (reading them) and of
    /// `structured` (writing them; both with "unhashable type: void-scalar"). 3.4 takes both.
    pub fn not_shardable(&self) -> Option<&'static str> {
        match self.name.as_str() {
            "raw_bytes" => Some("zarr-python 3.1 cannot read raw_bytes arrays sharded"),
            "structured" => Some("zarr-python 3.1 cannot write structured arrays sharded"),
            _ => None,
        }
    }

    /// Whether `v` is a fill value readers take for this type.
    pub fn check_fill(&self, v: &Value) -> Result<(), DataTypeError> {
        match fill_fault(&self.fill, v) {
            None => Ok(()),
            Some(why) => Err(DataTypeError::BadFill {
                value: v.to_string(),
                name: self.name.clone(),
                why: if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                },
            }),
        }
    }
}

fn fixed(name: &str, size: u64, fill: Fill) -> DataType {
    DataType {
        name: name.to_string(),
        item_size: Some(size),
        fill,
    }
}

fn int(name: &str, size: u64, signed: bool) -> DataType {
    let bits = 8 * size as u32;
    let (min, max) = match signed {
        true => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
        false => (0, (1i128 << bits) - 1),
    };
    fixed(name, size, Fill::Int { min, max })
}

/// A data type named by a bare string.
fn named(name: &str) -> Result<DataType, DataTypeError> {
    let t = match name {
        "bool" => fixed(name, 1, Fill::Bool),
        "int8" => int(name, 1, true),
        "uint8" => int(name, 1, false),
        "int16" => int(name, 2, true),
        "uint16" => int(name, 2, false),
        "int32" => int(name, 4, true),
        "uint32" => int(name, 4, false),
        "int64" => int(name, 8, true),
        "uint64" => int(name, 8, false),
        // tensorstore stores them a byte each (packing them needs a codec of its own).
        "int2" => fixed(name, 1, Fill::Int { min: -2, max: 1 }),
        "int4" => fixed(name, 1, Fill::Int { min: -8, max: 7 }),
        "float16" | "bfloat16" => fixed(name, 2, Fill::Float(2)),
        "float32" => fixed(name, 4, Fill::Float(4)),
        "float64" => fixed(name, 8, Fill::Float(8)),
        "complex64" => fixed(name, 8, Fill::Complex(4)),
        "complex128" => fixed(name, 16, Fill::Complex(8)),
        "float8_e3m4" | "float8_e4m3fn" | "float8_e4m3fnuz" | "float8_e4m3b11fnuz"
        | "float8_e5m2" | "float8_e5m2fnuz" | "float8_e8m0fnu" => fixed(name, 1, Fill::Float(1)),
        "string" | "variable_length_bytes" => DataType {
            name: name.to_string(),
            item_size: None,
            fill: Fill::Text,
        },
        raw => match raw.strip_prefix('r').and_then(|b| b.parse::<u64>().ok()) {
            Some(bits) if bits > 0 && bits.is_multiple_of(8) => {
                fixed(name, bits / 8, Fill::ByteArray(bits / 8))
            }
            _ => return Err(DataTypeError::Unknown(format!("{name:?}"))),
        },
    };
    Ok(t)
}

/// A data type written as `{"name": …, "configuration": {…}}`.
fn configured(name: &str, config: Option<&Value>) -> Result<DataType, DataTypeError> {
    let bad = |reason: &str| DataTypeError::BadConfiguration {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    let length = || {
        config
            .and_then(|c| c.get("length_bytes"))
            .and_then(Value::as_u64)
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("configuration.length_bytes must be a whole number above 0"))
    };
    match name {
        "numpy.datetime64" | "numpy.timedelta64" => {
            let unit = config.and_then(|c| c.get("unit")).and_then(Value::as_str);
            const UNITS: [&str; 13] = [
                "Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs",
            ];
            let scale = config
                .and_then(|c| c.get("scale_factor"))
                .and_then(Value::as_u64);
            match (unit, scale) {
                (Some(u), Some(1..)) if UNITS.contains(&u) || u == "as" || u == "generic" => {
                    Ok(fixed(name, 8, Fill::Time))
                }
                (_, None | Some(0)) => Err(bad("configuration.scale_factor must be 1 or more")),
                _ => Err(bad("configuration.unit is not a numpy time unit")),
            }
        }
        "null_terminated_bytes" | "fixed_length_utf32" | "raw_bytes" => {
            Ok(fixed(name, length()?, Fill::Text))
        }
        "structured" | "struct" => {
            let size = fields_size(config).map_err(|r| bad(&r))?;
            Ok(fixed(name, size, Fill::Structured))
        }
        // The short names written long (`{"name": "uint8"}`).
        other => named(other),
    }
}

/// The bytes one element of a structured type takes: its fields' sizes added up. Fields
/// are `[name, type]` pairs (zarr-python 3.1) or `{"name", "data_type"}` objects (3.4).
fn fields_size(config: Option<&Value>) -> Result<u64, String> {
    let fields = config
        .and_then(|c| c.get("fields"))
        .and_then(Value::as_array)
        .filter(|f| !f.is_empty())
        .ok_or("configuration.fields must list the fields")?;
    let mut size = 0u64;
    for f in fields {
        let t = match f {
            Value::Array(pair) if pair.len() == 2 => &pair[1],
            Value::Object(o) => o.get("data_type").ok_or("a field without data_type")?,
            _ => return Err(format!("field {f} is neither [name, type] nor an object")),
        };
        let field = DataType::of(t).map_err(|e| e.to_string())?;
        let n = field
            .item_size
            .ok_or_else(|| format!("field type {t} has no fixed size"))?;
        size = size.checked_add(n).ok_or("fields too large")?;
    }
    Ok(size)
}

/// Why `v` is no fill value of the kind `fill` (`Some("")`: no more to say), or `None`.
fn fill_fault(fill: &Fill, v: &Value) -> Option<String> {
    let ok = match (fill, v) {
        (Fill::Bool, Value::Bool(_)) => true,
        (Fill::Int { min, max }, Value::Number(n)) => {
            // Readers take a whole number written as a float (1.0) too.
            let whole = n
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 2f64.powi(63));
            let i = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from));
            let Some(i) = i.or(whole.map(|f| f as i128)) else {
                return Some("not a whole number".into());
            };
            if i < *min || i > *max {
                return Some(format!("outside {min}..={max}"));
            }
            true
        }
        (Fill::Float(size), v) => is_float(v, *size),
        (Fill::Complex(size), Value::Array(a)) => {
            a.len() == 2 && a.iter().all(|f| is_float(f, *size))
        }
        (Fill::ByteArray(n), Value::Array(a)) => {
            a.len() as u64 == *n && a.iter().all(|b| b.as_u64().is_some_and(|b| b < 256))
        }
        (Fill::Text, Value::String(_)) => true,
        (Fill::Time, Value::Number(n)) => n.as_i64().is_some(),
        (Fill::Time, Value::String(s)) => s == "NaT",
        (Fill::Structured, Value::String(_) | Value::Object(_)) => true,
        _ => false,
    };
    (!ok).then(String::new)
}

/// Whether `v` is a fill value of a float of `size` bytes (raw bits in hex: that many).
fn is_float(v: &Value, size: u64) -> bool {
    match v {
        Value::Number(_) => true,
        Value::String(s) => {
            matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity")
                || s.strip_prefix("0x").is_some_and(|h| {
                    h.len() as u64 == 2 * size && h.bytes().all(|b| b.is_ascii_hexdigit())
                })
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every data type and fill value zarr-python 3.1.6 and 3.4.2 and tensorstore 0.1.86
    /// wrote for an array made with it (as they wrote them), with its item size.
    #[test]
    fn what_the_writers_write_is_known_with_its_size() {
        let cases = [
            (json!("bool"), json!(false), Some(1)),
            (json!("uint64"), json!(0), Some(8)),
            (json!("float16"), json!(0.0), Some(2)),
            (json!("complex128"), json!([0.0, 0.0]), Some(16)),
            (json!("int4"), json!(0), Some(1)),
            (json!("int2"), json!(0), Some(1)),
            (json!("bfloat16"), json!(0.0), Some(2)),
            (json!("float8_e4m3fn"), json!(0.0), Some(1)),
            (json!("r24"), json!([0, 0, 0]), Some(3)),
            (
                json!({"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}}),
                json!(-9223372036854775808i64),
                Some(8),
            ),
            (
                json!({"name": "numpy.timedelta64", "configuration": {"unit": "ms", "scale_factor": 1}}),
                json!(-9223372036854775808i64),
                Some(8),
            ),
            (
                json!({"name": "null_terminated_bytes", "configuration": {"length_bytes": 7}}),
                json!(""),
                Some(7),
            ),
            (
                json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 20}}),
                json!(""),
                Some(20),
            ),
            (
                json!({"name": "raw_bytes", "configuration": {"length_bytes": 6}}),
                json!("AAAAAAAA"),
                Some(6),
            ),
            (
                json!({"name": "structured", "configuration": {"fields": [["a", "int32"], ["b", "float64"]]}}),
                json!("AAAAAAAAAAAAAAAA"),
                Some(12),
            ),
            (
                json!({"name": "struct", "configuration": {"fields": [
                    {"name": "a", "data_type": "int32"}, {"name": "b", "data_type": "float64"}]}}),
                json!({"a": 0, "b": 0.0}),
                Some(12),
            ),
            (json!("string"), json!(""), None),
            (json!("variable_length_bytes"), json!(""), None),
        ];
        for (data_type, fill, size) in cases {
            let t = DataType::of(&data_type).unwrap_or_else(|e| panic!("{data_type}: {e}"));
            assert_eq!(t.item_size, size, "{data_type}");
            t.check_fill(&fill)
                .unwrap_or_else(|e| panic!("{data_type}: {e}"));
        }
    }

    #[test]
    fn what_readers_refuse_is_refused() {
        for bad in [
            json!("uint12"),
            json!("r12"),
            json!("float128"),
            json!("float8_e4m3"),
            json!(3),
        ] {
            assert!(
                matches!(DataType::of(&bad), Err(DataTypeError::Unknown(_))),
                "{bad}"
            );
        }
        let no_length = json!({"name": "raw_bytes", "configuration": {}});
        assert!(DataType::of(&no_length).is_err());
        let u16 = DataType::of(&json!("uint16")).unwrap();
        assert!(u16.check_fill(&json!(70000)).is_err());
        assert!(u16.check_fill(&json!(-1)).is_err());
        assert!(u16.check_fill(&json!(1.5)).is_err());
        assert!(u16.check_fill(&json!(65535)).is_ok());
        assert!(
            u16.check_fill(&json!(255.0)).is_ok(),
            "a whole number written as a float"
        );
        let no_scale = json!({"name": "numpy.datetime64", "configuration": {"unit": "s"}});
        assert!(DataType::of(&no_scale).is_err());
        let f = DataType::of(&json!("float32")).unwrap();
        for good in [
            json!("NaN"),
            json!("-Infinity"),
            json!("0x7fc00000"),
            json!(1.5),
        ] {
            assert!(f.check_fill(&good).is_ok(), "{good}");
        }
        assert!(f.check_fill(&json!("nan")).is_err());
        let b = DataType::of(&json!("bool")).unwrap();
        assert!(b.check_fill(&json!(0)).is_err());
    }
}
