//! Zarr v2 arrays and groups as Zarr v3 documents, the chunks' bytes unchanged (pure, no
//! I/O): `.zarray` (+ `.zattrs`) becomes an array `zarr.json` whose codecs decode the very
//! bytes v2 wrote, and whose `v2` chunk key encoding names the very files (`0.0`, or `0/0`
//! with `dimension_separator: "/"`); `.zgroup` (+ `.zattrs`) a group's. What v3 cannot
//! say without re-encoding (filters, object and string types, a `null` fill value) is
//! refused with the reason.

use serde_json::{Map, Value, json};

use crate::zarr::{ArrayMetadata, GroupMetadata, Node};

/// The v2 documents' names.
pub const ZARRAY: &str = ".zarray";
pub const ZGROUP: &str = ".zgroup";
pub const ZATTRS: &str = ".zattrs";
/// v2 consolidated metadata: not carried over (it describes the v2 documents).
pub const ZMETADATA: &str = ".zmetadata";

/// The v3 array document for a `.zarray` (and its `.zattrs`), or why there is none.
pub fn array(zarray: &[u8], zattrs: Option<&[u8]>) -> Result<ArrayMetadata, String> {
    let v2: Map<String, Value> = serde_json::from_slice(zarray).map_err(|e| e.to_string())?;
    let get = |k: &str| v2.get(k).ok_or_else(|| format!("no \"{k}\""));
    if get("zarr_format")? != &json!(2) {
        return Err("not zarr_format 2".into());
    }
    let no_filters = |f: &Value| f.is_null() || f.as_array().is_some_and(Vec::is_empty);
    if !v2.get("filters").is_none_or(no_filters) {
        return Err("it has filters, which Zarr v3 cannot apply to the same bytes".into());
    }
    let dtype = get("dtype")?.as_str().ok_or("dtype is not a string")?;
    let (data_type, size, endian) = data_type(dtype)?;
    let shape = get("shape")?;
    let chunks = get("chunks")?;
    let ndim = shape.as_array().map_or(0, Vec::len);
    let mut codecs = Vec::new();
    match get("order")?.as_str() {
        Some("C") => {}
        Some("F") => codecs.push(json!({"name": "transpose",
            "configuration": {"order": (0..ndim).rev().collect::<Vec<_>>()}})),
        _ => return Err("order is neither \"C\" nor \"F\"".into()),
    }
    codecs.push(match endian {
        Some(e) => json!({"name": "bytes", "configuration": {"endian": e}}),
        None => json!({"name": "bytes"}),
    });
    if let Some(c) = compressor(get("compressor")?, size)? {
        codecs.push(c);
    }
    let separator = match v2.get("dimension_separator") {
        None => ".",
        Some(v) if v == "." => ".",
        Some(v) if v == "/" => "/",
        Some(other) => return Err(format!("dimension_separator {other}")),
    };
    let fill_value = fill_value(get("fill_value")?, data_type)?;
    let doc = json!({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": separator}},
        "fill_value": fill_value, "codecs": codecs, "attributes": attributes(zattrs)?,
    });
    match Node::from_value(doc) {
        Ok(Node::Array(a)) => Ok(a),
        Ok(Node::Group(_)) => Err("not an array".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The v3 group document for a `.zgroup` (and its `.zattrs`).
pub fn group(zattrs: Option<&[u8]>) -> Result<GroupMetadata, String> {
    let doc = json!({"zarr_format": 3, "node_type": "group", "attributes": attributes(zattrs)?});
    match Node::from_value(doc) {
        Ok(Node::Group(g)) => Ok(g),
        _ => Err("not a group".into()),
    }
}

fn attributes(zattrs: Option<&[u8]>) -> Result<Value, String> {
    match zattrs {
        None => Ok(json!({})),
        Some(b) => match serde_json::from_slice::<Value>(b) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err(".zattrs is not an object".into()),
            Err(e) => Err(format!(".zattrs: {e}")),
        },
    }
}

/// A v2 fill value in the form v3 readers take for `data_type`: a bool as `true`/`false`
/// (v2 writers also say 0 and 1), an integer as a number (also when written as a string);
/// floats keep `"NaN"` and the infinities.
fn fill_value(v: &Value, data_type: &str) -> Result<Value, String> {
    let bad = || format!("its fill_value {v} is not a {data_type}");
    match (v, data_type) {
        (Value::Null, _) => Err("its fill_value is null, which Zarr v3 has no form for".into()),
        (Value::Bool(_), "bool") => Ok(v.clone()),
        (Value::Number(n), "bool") => match n.as_u64() {
            Some(0) => Ok(json!(false)),
            Some(1) => Ok(json!(true)),
            _ => Err(bad()),
        },
        (_, t) if t.starts_with("int") || t.starts_with("uint") => {
            let text = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            if let Ok(n) = text.parse::<i64>() {
                Ok(json!(n))
            } else {
                text.parse::<u64>().map(|n| json!(n)).map_err(|_| bad())
            }
        }
        _ => Ok(v.clone()),
    }
}

/// A v2 dtype (`<u2`, `|b1`, `>f8`) as a v3 data type, its size, and its byte order.
fn data_type(dtype: &str) -> Result<(&'static str, u64, Option<&'static str>), String> {
    let (order, kind) = dtype.split_at(dtype.len().min(1));
    let name = match kind {
        "b1" => "bool",
        "i1" => "int8",
        "u1" => "uint8",
        "i2" => "int16",
        "u2" => "uint16",
        "f2" => "float16",
        "i4" => "int32",
        "u4" => "uint32",
        "f4" => "float32",
        "i8" => "int64",
        "u8" => "uint64",
        "f8" => "float64",
        "c8" => "complex64",
        "c16" => "complex128",
        _ => return Err(format!("dtype {dtype:?} has no Zarr v3 core type")),
    };
    let size: u64 = kind[1..].parse().unwrap_or(1);
    let endian = match (order, size) {
        (_, 1) => None,
        ("<", _) => Some("little"),
        (">", _) => Some("big"),
        _ => return Err(format!("dtype {dtype:?}: no byte order")),
    };
    Ok((name, size, endian))
}

/// The v3 codec decoding what a v2 compressor wrote.
fn compressor(c: &Value, item_size: u64) -> Result<Option<Value>, String> {
    if c.is_null() {
        return Ok(None);
    }
    let id = c.get("id").and_then(Value::as_str).unwrap_or("");
    let int = |k: &str, default: i64| c.get(k).and_then(Value::as_i64).unwrap_or(default);
    Ok(Some(match id {
        "zstd" if !(-131072..=22).contains(&int("level", 0)) => {
            return Err(format!("zstd level {} is out of range", int("level", 0)));
        }
        "zstd" => json!({"name": "zstd", "configuration": {"level": int("level", 0),
            "checksum": c.get("checksum").and_then(Value::as_bool).unwrap_or(false)}}),
        "gzip" => json!({"name": "gzip", "configuration": {"level": int("level", 1)}}),
        "blosc" => {
            let shuffle = match int("shuffle", 1) {
                0 => "noshuffle",
                1 => "shuffle",
                2 => "bitshuffle",
                -1 if item_size == 1 => "bitshuffle",
                -1 => "shuffle",
                s => return Err(format!("blosc shuffle {s}")),
            };
            let cname = c.get("cname").and_then(Value::as_str).unwrap_or("lz4");
            if !["lz4", "lz4hc", "blosclz", "zstd", "snappy", "zlib"].contains(&cname) {
                return Err(format!("blosc cname {cname:?}"));
            }
            json!({"name": "blosc", "configuration": {"cname": cname,
                "clevel": int("clevel", 5), "shuffle": shuffle, "typesize": item_size,
                "blocksize": int("blocksize", 0)}})
        }
        other => return Err(format!("compressor {other:?} has no Zarr v3 codec here")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(extra: &str) -> String {
        format!(
            r#"{{"zarr_format":2,"shape":[10,7],"chunks":[4,4],"dtype":"<u2","order":"C",
            "fill_value":0,"filters":null,"compressor":null{extra}}}"#
        )
    }

    #[test]
    fn a_plain_v2_array_keeps_its_keys_and_bytes() {
        let a = array(v2("").as_bytes(), Some(br#"{"x":1}"#)).unwrap();
        let doc = Node::Array(a).to_value();
        assert_eq!(doc["chunk_key_encoding"]["name"], "v2");
        assert_eq!(doc["chunk_key_encoding"]["configuration"]["separator"], ".");
        assert_eq!(doc["data_type"], "uint16");
        assert_eq!(
            doc["codecs"],
            json!([{"name":"bytes","configuration":{"endian":"little"}}])
        );
        assert_eq!(doc["attributes"], json!({"x": 1}));
    }

    #[test]
    fn fortran_order_big_endian_and_compressors_map_onto_v3_codecs() {
        let src = v2(r#","dimension_separator":"/""#)
            .replace(r#""order":"C""#, r#""order":"F""#)
            .replace("<u2", ">f8")
            .replace(
                r#""compressor":null"#,
                r#""compressor":{"id":"blosc","cname":"zstd","clevel":3,"shuffle":2,"blocksize":0}"#,
            );
        let doc = Node::Array(array(src.as_bytes(), None).unwrap()).to_value();
        assert_eq!(
            doc["codecs"][0],
            json!({"name":"transpose","configuration":{"order":[1,0]}})
        );
        assert_eq!(doc["codecs"][1]["configuration"]["endian"], "big");
        assert_eq!(doc["codecs"][2]["configuration"]["shuffle"], "bitshuffle");
        assert_eq!(doc["codecs"][2]["configuration"]["typesize"], 8);
        assert_eq!(doc["chunk_key_encoding"]["configuration"]["separator"], "/");
    }

    #[test]
    fn fill_values_and_empty_filters_take_the_form_v3_readers_take() {
        let of = |extra: &str, dtype: &str, fill: &str| {
            let src = v2(extra)
                .replace("<u2", dtype)
                .replace(r#""fill_value":0"#, &format!(r#""fill_value":{fill}"#));
            Node::Array(array(src.as_bytes(), None).unwrap()).to_value()["fill_value"].clone()
        };
        assert_eq!(of("", "|b1", "0"), json!(false));
        assert_eq!(of("", "<u8", r#""18446744073709551615""#), json!(u64::MAX));
        assert_eq!(of("", "<f4", r#""NaN""#), json!("NaN"));
        let no_filters = v2("").replace(r#""filters":null"#, r#""filters":[]"#);
        assert!(array(no_filters.as_bytes(), None).is_ok());
    }

    #[test]
    fn what_v3_cannot_say_is_refused_with_the_reason() {
        for (change, why) in [
            (
                v2("").replace(r#""filters":null"#, r#""filters":[{"id":"delta"}]"#),
                "filters",
            ),
            (v2("").replace("<u2", "|O"), "no Zarr v3 core type"),
            (
                v2("").replace(r#""fill_value":0"#, r#""fill_value":null"#),
                "null",
            ),
            (
                v2("").replace(r#""compressor":null"#, r#""compressor":{"id":"lzma"}"#),
                "lzma",
            ),
        ] {
            let e = array(change.as_bytes(), None).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }
}
