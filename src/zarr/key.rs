//! Chunk key encodings: grid coordinates <-> the key (relative path) of a chunk or shard.

use thiserror::Error;

use super::metadata::NamedConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Separator {
    Slash,
    Dot,
}

impl Separator {
    pub fn as_char(self) -> char {
        match self {
            Separator::Slash => '/',
            Separator::Dot => '.',
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkKeyEncoding {
    /// `c/1/2/3` (or `c.1.2.3`); a 0-d array's only chunk is `c`.
    Default(Separator),
    /// `1.2.3` (or `1/2/3`); a 0-d array's only chunk is `0`.
    V2(Separator),
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KeyError {
    #[error("unknown chunk key encoding {0:?}")]
    UnknownEncoding(String),
    #[error("chunk key separator {0} is neither \"/\" nor \".\"")]
    BadSeparator(String),
    #[error("{key:?} is not a chunk key of a {ndim}-d array with {encoding} encoding")]
    NotAKey {
        key: String,
        ndim: usize,
        encoding: &'static str,
    },
}

impl ChunkKeyEncoding {
    pub fn from_metadata(spec: &NamedConfig) -> Result<ChunkKeyEncoding, KeyError> {
        let sep = |default| match spec.config_value("separator") {
            None => Ok(default),
            Some(v) => match v.as_str() {
                Some("/") => Ok(Separator::Slash),
                Some(".") => Ok(Separator::Dot),
                _ => Err(KeyError::BadSeparator(v.to_string())),
            },
        };
        match spec.name.as_str() {
            "default" => Ok(ChunkKeyEncoding::Default(sep(Separator::Slash)?)),
            "v2" => Ok(ChunkKeyEncoding::V2(sep(Separator::Dot)?)),
            other => Err(KeyError::UnknownEncoding(other.to_string())),
        }
    }

    pub fn separator(self) -> Separator {
        match self {
            ChunkKeyEncoding::Default(s) | ChunkKeyEncoding::V2(s) => s,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ChunkKeyEncoding::Default(_) => "default",
            ChunkKeyEncoding::V2(_) => "v2",
        }
    }

    pub fn encode(self, coords: &[u64]) -> String {
        let sep = self.separator().as_char().to_string();
        let joined = coords
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(&sep);
        match (self, coords.is_empty()) {
            (ChunkKeyEncoding::Default(_), true) => "c".to_string(),
            (ChunkKeyEncoding::Default(_), false) => format!("c{sep}{joined}"),
            (ChunkKeyEncoding::V2(_), true) => "0".to_string(),
            (ChunkKeyEncoding::V2(_), false) => joined,
        }
    }

    /// Parses a key (a path relative to the array directory, `/`-separated) into grid
    /// coordinates. Only the canonical spelling is accepted (no leading zeros, no signs), so
    /// that every chunk has exactly one key.
    pub fn decode(self, key: &str, ndim: usize) -> Result<Vec<u64>, KeyError> {
        let not_a_key = || KeyError::NotAKey {
            key: key.to_string(),
            ndim,
            encoding: self.name(),
        };
        let sep = self.separator().as_char();
        let body = match self {
            ChunkKeyEncoding::Default(_) if ndim == 0 => {
                return if key == "c" {
                    Ok(vec![])
                } else {
                    Err(not_a_key())
                };
            }
            ChunkKeyEncoding::V2(_) if ndim == 0 => {
                return if key == "0" {
                    Ok(vec![])
                } else {
                    Err(not_a_key())
                };
            }
            ChunkKeyEncoding::Default(_) => key
                .strip_prefix('c')
                .and_then(|rest| rest.strip_prefix(sep))
                .ok_or_else(not_a_key)?,
            ChunkKeyEncoding::V2(_) => key,
        };
        let coords: Vec<u64> = body
            .split(sep)
            .map(parse_canonical)
            .collect::<Option<_>>()
            .ok_or_else(not_a_key)?;
        if coords.len() != ndim {
            return Err(not_a_key());
        }
        Ok(coords)
    }
}

/// A place in the tree of chunk keys below an array directory, as the unsharded view shows
/// it: the array directory itself, a directory that fixes the first coordinates (`c` fixes
/// none, `c/4` fixes one), or a chunk.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyNode {
    Root,
    Dir(Vec<u64>),
    Chunk(Vec<u64>),
}

impl KeyNode {
    /// The coordinates this node fixes.
    pub fn prefix(&self) -> &[u64] {
        match self {
            KeyNode::Root => &[],
            KeyNode::Dir(p) | KeyNode::Chunk(p) => p,
        }
    }
}

impl ChunkKeyEncoding {
    /// The node named `name` inside `parent`, if that name is part of a chunk key of an
    /// `ndim`-d array. Whether any chunk exists there is not this function's concern.
    pub fn child(self, parent: &KeyNode, name: &str, ndim: usize) -> Option<KeyNode> {
        match (self.separator(), parent) {
            (Separator::Dot, KeyNode::Root) => self.decode(name, ndim).ok().map(KeyNode::Chunk),
            (Separator::Dot, _) | (_, KeyNode::Chunk(_)) => None,
            (Separator::Slash, KeyNode::Root) => match self {
                ChunkKeyEncoding::Default(_) if name != "c" => None,
                ChunkKeyEncoding::Default(_) if ndim == 0 => Some(KeyNode::Chunk(vec![])),
                ChunkKeyEncoding::Default(_) => Some(KeyNode::Dir(vec![])),
                ChunkKeyEncoding::V2(_) if ndim == 0 => {
                    (name == "0").then(|| KeyNode::Chunk(vec![]))
                }
                ChunkKeyEncoding::V2(_) => descend(&[], name, ndim),
            },
            (Separator::Slash, KeyNode::Dir(prefix)) => descend(prefix, name, ndim),
        }
    }

    /// The entry of `parent`'s listing through which `chunk` (which lies below `parent`)
    /// is reached: its name and node.
    pub fn child_towards(self, parent: &KeyNode, chunk: &[u64]) -> (String, KeyNode) {
        let default = matches!(self, ChunkKeyEncoding::Default(_));
        match (self.separator(), parent) {
            (Separator::Dot, _) => (self.encode(chunk), KeyNode::Chunk(chunk.to_vec())),
            (Separator::Slash, KeyNode::Root) if default && chunk.is_empty() => {
                ("c".into(), KeyNode::Chunk(vec![]))
            }
            (Separator::Slash, KeyNode::Root) if default => ("c".into(), KeyNode::Dir(vec![])),
            (Separator::Slash, KeyNode::Root) if chunk.is_empty() => {
                ("0".into(), KeyNode::Chunk(vec![]))
            }
            (Separator::Slash, node) => {
                let depth = node.prefix().len();
                let name = chunk[depth].to_string();
                if depth + 1 == chunk.len() {
                    (name, KeyNode::Chunk(chunk.to_vec()))
                } else {
                    (name, KeyNode::Dir(chunk[..=depth].to_vec()))
                }
            }
        }
    }

    /// The directory (relative to the array directory, "" for itself) whose subtree holds
    /// every key that starts with `prefix`. `prefix` is shorter than the array's rank.
    pub fn prefix_dir(self, prefix: &[u64]) -> String {
        let joined = || {
            let parts: Vec<String> = prefix.iter().map(u64::to_string).collect();
            parts.join("/")
        };
        match (self.separator(), self) {
            (Separator::Dot, _) => String::new(),
            (Separator::Slash, ChunkKeyEncoding::Default(_)) if prefix.is_empty() => "c".into(),
            (Separator::Slash, ChunkKeyEncoding::Default(_)) => format!("c/{}", joined()),
            (Separator::Slash, ChunkKeyEncoding::V2(_)) => joined(),
        }
    }
}

fn descend(prefix: &[u64], name: &str, ndim: usize) -> Option<KeyNode> {
    let v = parse_canonical(name)?;
    let mut coords = prefix.to_vec();
    coords.push(v);
    match coords.len().cmp(&ndim) {
        std::cmp::Ordering::Less => Some(KeyNode::Dir(coords)),
        std::cmp::Ordering::Equal => Some(KeyNode::Chunk(coords)),
        std::cmp::Ordering::Greater => None,
    }
}

fn parse_canonical(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enc(name: &str, sep: Option<&str>) -> ChunkKeyEncoding {
        let cfg = sep.map(|s| json!({ "separator": s }));
        ChunkKeyEncoding::from_metadata(&NamedConfig::new(name, cfg)).unwrap()
    }

    #[test]
    fn defaults_and_separators() {
        assert_eq!(
            enc("default", None),
            ChunkKeyEncoding::Default(Separator::Slash)
        );
        assert_eq!(enc("v2", None), ChunkKeyEncoding::V2(Separator::Dot));
        assert_eq!(
            enc("default", Some(".")),
            ChunkKeyEncoding::Default(Separator::Dot)
        );
        assert_eq!(enc("v2", Some("/")), ChunkKeyEncoding::V2(Separator::Slash));
        assert!(matches!(
            ChunkKeyEncoding::from_metadata(&NamedConfig::new("weird", None)),
            Err(KeyError::UnknownEncoding(_))
        ));
        assert!(matches!(
            ChunkKeyEncoding::from_metadata(&NamedConfig::new(
                "default",
                Some(json!({"separator": "-"}))
            )),
            Err(KeyError::BadSeparator(_))
        ));
    }

    #[test]
    fn encode_decode_all_four_forms() {
        let cases = [
            (enc("default", None), "c/1/23/0"),
            (enc("default", Some(".")), "c.1.23.0"),
            (enc("v2", None), "1.23.0"),
            (enc("v2", Some("/")), "1/23/0"),
        ];
        for (e, key) in cases {
            assert_eq!(e.encode(&[1, 23, 0]), key);
            assert_eq!(e.decode(key, 3).unwrap(), vec![1, 23, 0]);
        }
        assert_eq!(enc("default", None).encode(&[]), "c");
        assert_eq!(enc("v2", None).encode(&[]), "0");
        assert_eq!(
            enc("default", None).decode("c", 0).unwrap(),
            Vec::<u64>::new()
        );
        assert_eq!(enc("v2", None).decode("0", 0).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn non_keys_are_rejected() {
        let d = enc("default", None);
        for bad in [
            "c/1/2",
            "c/1/2/3/4",
            "1/2/3",
            "c/01/2/3",
            "c/1/x/3",
            "c//2/3",
            "c/1/2/3/",
            "c/-1/2/3",
            "c/1/2/3.abc.partial",
            "zarr.json",
            "c",
        ] {
            assert!(
                matches!(d.decode(bad, 3), Err(KeyError::NotAKey { .. })),
                "{bad}"
            );
        }
        let v2 = enc("v2", None);
        assert!(v2.decode("1.2", 3).is_err());
        assert!(v2.decode("1.2.3.partial", 3).is_err());
    }

    #[test]
    fn navigating_the_key_tree() {
        let d = enc("default", None);
        let root = KeyNode::Root;
        assert_eq!(d.child(&root, "c", 3), Some(KeyNode::Dir(vec![])));
        assert_eq!(d.child(&root, "0", 3), None);
        let c = KeyNode::Dir(vec![]);
        assert_eq!(d.child(&c, "4", 3), Some(KeyNode::Dir(vec![4])));
        assert_eq!(d.child(&c, "04", 3), None);
        assert_eq!(
            d.child(&KeyNode::Dir(vec![4, 5]), "6", 3),
            Some(KeyNode::Chunk(vec![4, 5, 6]))
        );
        assert_eq!(d.child(&KeyNode::Dir(vec![4, 5]), "6.x.partial", 3), None);
        assert_eq!(d.child(&root, "c", 0), Some(KeyNode::Chunk(vec![])));
        assert_eq!(d.child_towards(&root, &[4, 5, 6]), ("c".into(), c.clone()));
        assert_eq!(
            d.child_towards(&c, &[4, 5, 6]),
            ("4".into(), KeyNode::Dir(vec![4]))
        );
        assert_eq!(
            d.child_towards(&KeyNode::Dir(vec![4, 5]), &[4, 5, 6]),
            ("6".into(), KeyNode::Chunk(vec![4, 5, 6]))
        );
        assert_eq!(d.prefix_dir(&[4, 5]), "c/4/5");
        assert_eq!(d.prefix_dir(&[]), "c");

        let v2s = enc("v2", Some("/"));
        assert_eq!(v2s.child(&root, "4", 2), Some(KeyNode::Dir(vec![4])));
        assert_eq!(v2s.child(&root, "4", 1), Some(KeyNode::Chunk(vec![4])));
        assert_eq!(v2s.child(&root, "0", 0), Some(KeyNode::Chunk(vec![])));
        assert_eq!(
            v2s.child_towards(&root, &[4, 1]),
            ("4".into(), KeyNode::Dir(vec![4]))
        );

        let dot = enc("default", Some("."));
        assert_eq!(
            dot.child(&root, "c.1.2", 2),
            Some(KeyNode::Chunk(vec![1, 2]))
        );
        assert_eq!(dot.child(&root, "c", 2), None);
        assert_eq!(
            dot.child_towards(&root, &[1, 2]),
            ("c.1.2".into(), KeyNode::Chunk(vec![1, 2]))
        );
        assert_eq!(dot.prefix_dir(&[1]), "");
        assert_eq!(v2s.prefix_dir(&[4]), "4");
        assert_eq!(v2s.prefix_dir(&[]), "");
        let v2 = enc("v2", None);
        assert_eq!(v2.child(&root, "1.2", 2), Some(KeyNode::Chunk(vec![1, 2])));
    }
}
