//! Documents keep their numbers exactly. A `zarr.json` is read into serde values, where a
//! whole number past 64 bits (an attribute `2**70`) is a float; written back, it would
//! read `1.1805916207174113e+21` to every reader after. So a document rewritten from one
//! that was read (`Node::parse` keeps its text) takes, for every number or string whose
//! value did not change, the original's text of it (`keep_original_scalars`).

use serde_json::Value;

/// Where a JSON value lies in a text, and what is inside it.
struct Span {
    start: usize,
    end: usize,
    inside: Inside,
}

enum Inside {
    Object(Vec<(String, Span)>),
    Array(Vec<Span>),
    Scalar,
}

/// `new` (a document written from values read out of `original`), with every scalar
/// whose value equals the one at the same place in `original` as `original` wrote it.
/// Either text unreadable: `new` as it is.
pub fn keep_original_scalars(original: &[u8], new: Vec<u8>) -> Vec<u8> {
    let (Some(old), Some(now)) = (tree(original), tree(&new)) else {
        return new;
    };
    let mut swaps = Vec::new();
    collect(&now, &old, &new, original, &mut swaps);
    if swaps.is_empty() {
        return new;
    }
    let mut out = Vec::with_capacity(new.len());
    let mut at = 0;
    for (here, there) in swaps {
        out.extend_from_slice(&new[at..here.0]);
        out.extend_from_slice(&original[there.0..there.1]);
        at = here.1;
    }
    out.extend_from_slice(&new[at..]);
    out
}

/// A scalar of the new text (its range) to take from the original (its range).
type Swap = ((usize, usize), (usize, usize));

/// The scalars of `now` to take from `old`, in the order they lie in `now_text`.
fn collect(now: &Span, old: &Span, now_text: &[u8], old_text: &[u8], swaps: &mut Vec<Swap>) {
    match (&now.inside, &old.inside) {
        (Inside::Object(n), Inside::Object(o)) => {
            // By key (a consolidated group may have tens of thousands of entries).
            let old_members: std::collections::HashMap<&str, &Span> =
                o.iter().map(|(k, v)| (k.as_str(), v)).collect();
            for (key, child) in n {
                if let Some(was) = old_members.get(key.as_str()) {
                    collect(child, was, now_text, old_text, swaps);
                }
            }
        }
        (Inside::Array(n), Inside::Array(o)) if n.len() == o.len() => {
            for (child, was) in n.iter().zip(o) {
                collect(child, was, now_text, old_text, swaps);
            }
        }
        (Inside::Scalar, Inside::Scalar) => {
            let (a, b) = (&now_text[now.start..now.end], &old_text[old.start..old.end]);
            let same = serde_json::from_slice::<Value>(a).ok() == serde_json::from_slice(b).ok();
            if a != b && same {
                swaps.push(((now.start, now.end), (old.start, old.end)));
            }
        }
        _ => {}
    }
}

fn tree(text: &[u8]) -> Option<Span> {
    let mut at = 0;
    let span = value(text, &mut at)?;
    skip_space(text, &mut at);
    (at == text.len()).then_some(span)
}

fn skip_space(t: &[u8], at: &mut usize) {
    while t.get(*at).is_some_and(u8::is_ascii_whitespace) {
        *at += 1;
    }
}

fn value(t: &[u8], at: &mut usize) -> Option<Span> {
    skip_space(t, at);
    let start = *at;
    let inside = match *t.get(*at)? {
        b'{' => Inside::Object(members(t, at)?),
        b'[' => Inside::Array(elements(t, at)?),
        b'"' => {
            string_end(t, at)?;
            Inside::Scalar
        }
        _ => {
            while t.get(*at).is_some_and(|b| !b",]} \t\r\n".contains(b)) {
                *at += 1;
            }
            Inside::Scalar
        }
    };
    (*at > start).then_some(Span {
        start,
        end: *at,
        inside,
    })
}

fn members(t: &[u8], at: &mut usize) -> Option<Vec<(String, Span)>> {
    items(t, at, b'}', |t, at| {
        let key_start = *at;
        string_end(t, at)?;
        let key: String = serde_json::from_slice(&t[key_start..*at]).ok()?;
        skip_space(t, at);
        (*t.get(*at)? == b':').then_some(())?;
        *at += 1;
        Some((key, value(t, at)?))
    })
}

fn elements(t: &[u8], at: &mut usize) -> Option<Vec<Span>> {
    items(t, at, b']', value)
}

/// The items of the object or array opening at `at`, each read by `item`, up to `close`.
fn items<T>(
    t: &[u8],
    at: &mut usize,
    close: u8,
    item: impl Fn(&[u8], &mut usize) -> Option<T>,
) -> Option<Vec<T>> {
    *at += 1;
    let mut out = Vec::new();
    loop {
        skip_space(t, at);
        match *t.get(*at)? {
            b if b == close => {
                *at += 1;
                return Some(out);
            }
            b',' => *at += 1,
            _ => out.push(item(t, at)?),
        }
    }
}

/// Moves past the string starting at `at` (its closing quote included).
fn string_end(t: &[u8], at: &mut usize) -> Option<()> {
    (*t.get(*at)? == b'"').then_some(())?;
    *at += 1;
    loop {
        match *t.get(*at)? {
            b'\\' => *at += 2,
            b'"' => {
                *at += 1;
                return Some(());
            }
            _ => *at += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::{Node, ShardPolicy, sharded_from};

    const DOC: &str = r#"{"zarr_format": 3, "node_type": "array", "shape": [8],
        "data_type": "uint64", "fill_value": 18446744073709551615,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "codecs": [{"name": "bytes"}],
        "attributes": {"big": 1180591620717411303424, "small": 1.0e3,
                       "list": [36893488147419103232, "x\u00e9"]}}"#;

    /// A document rewritten (here: sharded) keeps every number it did not change as it was
    /// written: 2**70 stays 2**70 (it became 1.1805916207174113e+21).
    #[test]
    fn numbers_past_64_bits_survive_a_rewrite() {
        let Node::Array(a) = Node::parse(DOC.as_bytes()).unwrap() else {
            unreachable!()
        };
        let policy = ShardPolicy::Explicit("4".parse().unwrap());
        let sharded = sharded_from(&a, &policy).unwrap();
        let text = String::from_utf8(Node::Array(sharded).to_json_bytes()).unwrap();
        for kept in [
            "1180591620717411303424",
            "36893488147419103232",
            "18446744073709551615",
        ] {
            assert!(text.contains(kept), "{kept} in {text}");
        }
        assert!(text.contains("sharding_indexed"), "{text}");
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["attributes"]["small"], 1000.0);
    }

    #[test]
    fn a_document_read_and_written_unchanged_keeps_its_values() {
        let new = br#"{"a": 1.1805916207174113e+21, "b": [1, 2], "c": "d"}"#.to_vec();
        let old = br#"{"c":"d","a":1180591620717411303424,"b":[1,2]}"#;
        let kept = keep_original_scalars(old, new);
        assert_eq!(
            String::from_utf8(kept).unwrap(),
            r#"{"a": 1180591620717411303424, "b": [1, 2], "c": "d"}"#
        );
    }
}
