//! The Zarr v3 `zarr.json` documents, as plain serde data. Only the fields shardfs reasons
//! about are typed; everything else (attributes, dimension_names, extension fields, codec
//! options) rides along in `extra` maps so that a document survives a round trip unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

/// An extension point of the spec: `{"name": ..., "configuration": {...}}`, or the short
/// form, a bare name string. Used for codecs, chunk grids and chunk key encodings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "NamedConfigRepr", into = "NamedConfigRepr")]
pub struct NamedConfig {
    pub name: String,
    pub configuration: Option<Map<String, Value>>,
    pub extra: Map<String, Value>,
    /// Written as a bare string; kept so that re-serialising does not change the form.
    short_form: bool,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum NamedConfigRepr {
    Short(String),
    Full {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        configuration: Option<Map<String, Value>>,
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
}

impl From<NamedConfigRepr> for NamedConfig {
    fn from(r: NamedConfigRepr) -> Self {
        match r {
            NamedConfigRepr::Short(name) => NamedConfig {
                name,
                configuration: None,
                extra: Map::new(),
                short_form: true,
            },
            NamedConfigRepr::Full {
                name,
                configuration,
                extra,
            } => NamedConfig {
                name,
                configuration,
                extra,
                short_form: false,
            },
        }
    }
}

impl From<NamedConfig> for NamedConfigRepr {
    fn from(n: NamedConfig) -> Self {
        if n.short_form && n.configuration.is_none() && n.extra.is_empty() {
            NamedConfigRepr::Short(n.name)
        } else {
            NamedConfigRepr::Full {
                name: n.name,
                configuration: n.configuration,
                extra: n.extra,
            }
        }
    }
}

impl NamedConfig {
    pub fn new(name: &str, configuration: Option<Value>) -> NamedConfig {
        NamedConfig {
            name: name.to_string(),
            configuration: configuration.and_then(|c| match c {
                Value::Object(m) => Some(m),
                _ => None,
            }),
            extra: Map::new(),
            short_form: false,
        }
    }

    pub fn config_value(&self, key: &str) -> Option<&Value> {
        self.configuration.as_ref().and_then(|c| c.get(key))
    }

    /// The configuration as a typed struct (missing configuration reads as `{}`).
    pub fn config_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(Value::Object(
            self.configuration.clone().unwrap_or_default(),
        ))
    }
}

/// An array's `zarr.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArrayMetadata {
    pub shape: Vec<u64>,
    pub data_type: Value,
    pub chunk_grid: NamedConfig,
    pub chunk_key_encoding: NamedConfig,
    pub fill_value: Value,
    pub codecs: Vec<NamedConfig>,
    /// attributes, dimension_names, storage_transformers and any extension field.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    pub zarr_format: u64,
    pub node_type: String,
    /// The document's top-level key order, kept so that a rewritten document differs from
    /// the original only where its values do.
    #[serde(skip)]
    pub key_order: Vec<String>,
    /// The text it was read from (`Node::parse`), whose numbers a rewrite keeps exactly.
    #[serde(skip)]
    pub source: Source,
}

/// The text a document was read from (`zarr::exact`). Two documents of equal values are
/// equal, whatever their texts.
#[derive(Clone, Debug, Default)]
pub struct Source(pub Option<std::sync::Arc<[u8]>>);

impl PartialEq for Source {
    fn eq(&self, _: &Source) -> bool {
        true
    }
}

/// A group's `zarr.json`. Consolidated metadata stays in `extra` (it may be `null`, and its
/// exact form must survive); `consolidated_entries` gives access to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupMetadata {
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    pub zarr_format: u64,
    pub node_type: String,
    #[serde(skip)]
    pub key_order: Vec<String>,
    #[serde(skip)]
    pub source: Source,
}

// Few documents are alive at once; boxing the array variant would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Array(ArrayMetadata),
    Group(GroupMetadata),
}

#[derive(Debug, Error)]
pub enum MetadataError {
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("zarr_format is {0}, not 3")]
    NotV3(Value),
    #[error("node_type is {0}, neither \"array\" nor \"group\"")]
    UnknownNodeType(Value),
    #[error("invalid {node} metadata: {source}")]
    Invalid {
        node: &'static str,
        source: serde_json::Error,
    },
}

impl Node {
    pub fn parse(bytes: &[u8]) -> Result<Node, MetadataError> {
        let value: Value = serde_json::from_slice(bytes).map_err(MetadataError::Json)?;
        let source = Source(Some(std::sync::Arc::from(bytes)));
        Ok(match Node::from_value(value)? {
            Node::Array(a) => Node::Array(ArrayMetadata { source, ..a }),
            Node::Group(g) => Node::Group(GroupMetadata { source, ..g }),
        })
    }

    pub fn from_value(value: Value) -> Result<Node, MetadataError> {
        let obj = value.as_object().ok_or(MetadataError::NotAnObject)?;
        match obj.get("zarr_format") {
            Some(Value::Number(n)) if n.as_u64() == Some(3) => {}
            other => return Err(MetadataError::NotV3(other.cloned().unwrap_or(Value::Null))),
        }
        let key_order: Vec<String> = obj.keys().cloned().collect();
        match obj.get("node_type").and_then(Value::as_str) {
            Some("array") => serde_json::from_value(value)
                .map(|a| Node::Array(ArrayMetadata { key_order, ..a }))
                .map_err(|source| MetadataError::Invalid {
                    node: "array",
                    source,
                }),
            Some("group") => serde_json::from_value(value)
                .map(|g| Node::Group(GroupMetadata { key_order, ..g }))
                .map_err(|source| MetadataError::Invalid {
                    node: "group",
                    source,
                }),
            _ => Err(MetadataError::UnknownNodeType(
                obj.get("node_type").cloned().unwrap_or(Value::Null),
            )),
        }
    }

    pub fn to_value(&self) -> Value {
        // Serialising plain maps, strings and numbers cannot fail.
        let (value, order) = match self {
            Node::Array(a) => (serde_json::to_value(a), &a.key_order),
            Node::Group(g) => (serde_json::to_value(g), &g.key_order),
        };
        match value {
            Ok(Value::Object(mut fields)) => {
                let mut ordered = Map::new();
                for key in order {
                    if let Some(v) = fields.shift_remove(key) {
                        ordered.insert(key.clone(), v);
                    }
                }
                ordered.extend(fields);
                Value::Object(ordered)
            }
            _ => Value::Null,
        }
    }

    /// Pretty JSON with two-space indentation, as zarr-python writes it; what did not change
    /// since it was read, as its text had it (`zarr::exact`).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let new = serde_json::to_vec_pretty(&self.to_value()).unwrap_or_default();
        let source = match self {
            Node::Array(a) => &a.source,
            Node::Group(g) => &g.source,
        };
        match &source.0 {
            Some(text) => super::exact::keep_original_scalars(text, new),
            None => new,
        }
    }
}

impl ArrayMetadata {
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    pub fn attributes(&self) -> Option<&Map<String, Value>> {
        self.extra.get("attributes").and_then(Value::as_object)
    }

    pub fn dimension_names(&self) -> Option<&Value> {
        self.extra.get("dimension_names")
    }

    /// True when `storage_transformers` is present and not empty.
    pub fn has_storage_transformers(&self) -> bool {
        match self.extra.get("storage_transformers") {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        }
    }

    /// Bytes per element (`zarr::dtype`); `None` for variable-size types and ones no
    /// reader knows.
    pub fn item_size(&self) -> Option<u64> {
        self.data_type().ok()?.item_size
    }

    /// The array's data type (`zarr::dtype`).
    pub fn data_type(&self) -> Result<super::DataType, super::DataTypeError> {
        super::DataType::of(&self.data_type)
    }
}

impl GroupMetadata {
    pub fn attributes(&self) -> Option<&Map<String, Value>> {
        self.extra.get("attributes").and_then(Value::as_object)
    }

    /// The `consolidated_metadata.metadata` map (child path -> node metadata), if any.
    pub fn consolidated_entries(&self) -> Option<&Map<String, Value>> {
        self.extra
            .get("consolidated_metadata")?
            .get("metadata")?
            .as_object()
    }

    pub fn consolidated_entries_mut(&mut self) -> Option<&mut Map<String, Value>> {
        self.extra
            .get_mut("consolidated_metadata")?
            .get_mut("metadata")?
            .as_object_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn array_round_trip_keeps_everything() {
        let doc = json!({
            "shape": [10, 7], "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
            "chunk_key_encoding": {"name": "default"},
            "fill_value": 0.0,
            "codecs": ["bytes", {"name": "zstd", "configuration": {"level": 3, "x": [1]}, "must_understand": false}],
            "attributes": {"a": {"b": [1, 2.5, null]}},
            "dimension_names": ["y", null],
            "storage_transformers": [],
            "zarr_format": 3, "node_type": "array",
            "my_extension": {"must_understand": false}
        });
        let node = Node::from_value(doc.clone()).unwrap();
        assert_eq!(node.to_value(), doc);
        // Key order too, not only the values.
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&node.to_value()), keys(&doc));
        let Node::Array(a) = &node else {
            panic!("not an array")
        };
        assert_eq!(a.shape, vec![10, 7]);
        assert_eq!(a.codecs[0].name, "bytes");
        assert_eq!(a.codecs[1].config_value("level"), Some(&json!(3)));
        assert_eq!(a.dimension_names(), Some(&json!(["y", null])));
        assert!(!a.has_storage_transformers());
        assert_eq!(a.item_size(), Some(2));
        // The float fill value keeps its form.
        assert!(
            String::from_utf8(node.to_json_bytes())
                .unwrap()
                .contains("0.0")
        );
    }

    #[test]
    fn group_round_trip_keeps_null_consolidated() {
        let doc = json!({"zarr_format": 3, "node_type": "group", "attributes": {},
                         "consolidated_metadata": null});
        assert_eq!(Node::from_value(doc.clone()).unwrap().to_value(), doc);
    }

    #[test]
    fn garbage_gives_typed_errors() {
        assert!(matches!(Node::parse(b"{nope"), Err(MetadataError::Json(_))));
        assert!(matches!(
            Node::parse(b"[1]"),
            Err(MetadataError::NotAnObject)
        ));
        assert!(matches!(
            Node::parse(br#"{"zarr_format": 2}"#),
            Err(MetadataError::NotV3(_))
        ));
        assert!(matches!(
            Node::parse(br#"{"zarr_format": 3, "node_type": "blob"}"#),
            Err(MetadataError::UnknownNodeType(_))
        ));
        assert!(matches!(
            Node::parse(br#"{"zarr_format": 3, "node_type": "array", "shape": "x"}"#),
            Err(MetadataError::Invalid { node: "array", .. })
        ));
    }

    #[test]
    fn item_sizes() {
        let mut a = match Node::from_value(json!({
            "shape": [1], "data_type": "r24",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": [],
            "zarr_format": 3, "node_type": "array"}))
        .unwrap()
        {
            Node::Array(a) => a,
            Node::Group(_) => unreachable!(),
        };
        assert_eq!(a.item_size(), Some(3));
        a.data_type = json!("complex128");
        assert_eq!(a.item_size(), Some(16));
        a.data_type = json!("string");
        assert_eq!(a.item_size(), None);
    }
}
