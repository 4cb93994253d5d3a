//! What the readers (zarr-python, tensorstore) refuse in an array's `zarr.json` beyond its
//! layout: an unknown data type, a fill value that is not of it, dimension names that do
//! not match the shape, a codec neither reader knows. `shardfs verify` reports each.

use serde_json::Value;

use super::{ArrayMetadata, NamedConfig};

/// Codecs a reader knows: the spec's, and those zarr-python adds for its variable-size
/// types (`numcodecs.*` names are read by zarr-python when numcodecs has them).
const KNOWN_CODECS: [&str; 9] = [
    "bytes",
    "transpose",
    "crc32c",
    "gzip",
    "zstd",
    "blosc",
    "sharding_indexed",
    "vlen-utf8",
    "vlen-bytes",
];

/// Everything in `meta` that makes readers refuse the array, one line each.
pub fn reader_faults(meta: &ArrayMetadata) -> Vec<String> {
    let mut faults = Vec::new();
    match meta.data_type() {
        Err(e) => faults.push(e.to_string()),
        Ok(t) => {
            if let Err(e) = t.check_fill(&meta.fill_value) {
                faults.push(e.to_string());
            }
            if t.name.starts_with('r') && t.name[1..].bytes().all(|b| b.is_ascii_digit()) {
                faults.push(format!(
                    "data_type {}: neither zarr-python nor tensorstore reads raw bits types",
                    t.name
                ));
            }
        }
    }
    if let Some(fault) = dimension_names_fault(meta) {
        faults.push(fault);
    }
    let mut names = Vec::new();
    codec_names(&meta.codecs, &mut names);
    for name in names {
        if !KNOWN_CODECS.contains(&name.as_str()) && !name.starts_with("numcodecs.") {
            faults.push(format!(
                "codec {name:?} is none that zarr-python or tensorstore reads"
            ));
        }
    }
    faults
}

fn dimension_names_fault(meta: &ArrayMetadata) -> Option<String> {
    let names = match meta.extra.get("dimension_names") {
        None | Some(Value::Null) => return None,
        Some(Value::Array(a)) => a,
        Some(other) => return Some(format!("dimension_names {other} is not a list")),
    };
    if names.len() != meta.shape.len() {
        return Some(format!(
            "dimension_names has {} names, the array {} dimensions",
            names.len(),
            meta.shape.len()
        ));
    }
    names
        .iter()
        .find(|n| !matches!(n, Value::String(_) | Value::Null))
        .map(|n| format!("dimension name {n} is neither a string nor null"))
}

/// The names of `codecs` and of every codec inside them (a shard's inner and index codecs).
fn codec_names(codecs: &[NamedConfig], out: &mut Vec<String>) {
    for c in codecs {
        out.push(c.name.clone());
        for key in ["codecs", "index_codecs"] {
            if let Some(inner) = c.config_value(key)
                && let Ok(inner) = serde_json::from_value::<Vec<NamedConfig>>(inner.clone())
            {
                codec_names(&inner, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::Node;
    use serde_json::json;

    fn array(doc: Value) -> ArrayMetadata {
        match Node::from_value(doc).unwrap() {
            Node::Array(a) => a,
            Node::Group(_) => unreachable!(),
        }
    }

    fn doc() -> Value {
        json!({"zarr_format": 3, "node_type": "array", "shape": [4, 4], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "crc32c"}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                 {"name": "crc32c"}]}}],
            "dimension_names": ["y", null]})
    }

    #[test]
    fn a_sound_document_has_no_fault() {
        assert_eq!(reader_faults(&array(doc())), Vec::<String>::new());
    }

    #[test]
    fn each_thing_readers_refuse_is_named() {
        let cases: [(&str, Value, &str); 6] = [
            ("data_type", json!("uint12"), "uint12"),
            ("data_type", json!("r16"), "raw bits"),
            ("fill_value", json!(70000), "70000"),
            ("dimension_names", json!(["y"]), "1 names"),
            ("dimension_names", json!(["y", 3]), "neither"),
            (
                "codecs",
                json!([{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1],
                    "codecs": [{"name": "bytes"}, {"name": "lz5"}]}}]),
                "\"lz5\"",
            ),
        ];
        for (field, value, said) in cases {
            let mut d = doc();
            if value == json!("r16") {
                d["fill_value"] = json!([0, 0]);
            }
            d[field] = value;
            let faults = reader_faults(&array(d));
            assert_eq!(faults.len(), 1, "{field}: {faults:?}");
            assert!(faults[0].contains(said), "{field}: {faults:?}");
        }
    }
}
