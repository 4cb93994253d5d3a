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

    /// Whether a directory at relative path `dir` ("" for the array directory itself) can
    /// hold chunk keys of an `ndim`-d array, and how many coordinates it already fixes.
    /// Used to tell chunk directories from other directories.
    pub fn dir_prefix_depth(self, dir: &str, ndim: usize) -> Option<usize> {
        if dir.is_empty() {
            return Some(0);
        }
        if self.separator() != Separator::Slash {
            return None;
        }
        let mut parts = dir.split('/');
        if matches!(self, ChunkKeyEncoding::Default(_)) && parts.next() != Some("c") {
            return None;
        }
        let mut depth = 0;
        for part in parts {
            parse_canonical(part)?;
            depth += 1;
        }
        // A directory fixes at most ndim - 1 coordinates; the last one names a file.
        (depth < ndim).then_some(depth)
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
    fn chunk_directory_prefixes() {
        let d = enc("default", None);
        assert_eq!(d.dir_prefix_depth("", 3), Some(0));
        assert_eq!(d.dir_prefix_depth("c", 3), Some(0));
        assert_eq!(d.dir_prefix_depth("c/4", 3), Some(1));
        assert_eq!(d.dir_prefix_depth("c/4/5", 3), Some(2));
        assert_eq!(d.dir_prefix_depth("c/4/5/6", 3), None);
        assert_eq!(d.dir_prefix_depth("d/4", 3), None);
        assert_eq!(enc("v2", None).dir_prefix_depth("1", 3), None);
        assert_eq!(enc("v2", Some("/")).dir_prefix_depth("1", 3), Some(1));
    }
}
