//! How many inner chunks go into a shard, along each axis, when shardfs chooses the layout
//! of an array that a writer created unsharded.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::grid;

/// 128 MiB of uncompressed data per shard: large enough that an array of a few hundred GiB
/// has a few thousand files, small enough to be assembled in memory.
pub const DEFAULT_TARGET_BYTES: u64 = 128 * 1024 * 1024;

/// `Auto` never puts more chunks than this in one shard (a 1 MiB index), however small the
/// chunks: tiny chunks would otherwise give huge indexes and per-chunk bookkeeping.
pub const AUTO_MAX_CHUNKS_PER_SHARD: u64 = 1 << 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardPolicy {
    /// Grow chunks per shard evenly across the axes toward `target_bytes` of uncompressed
    /// data per shard.
    Auto { target_bytes: u64 },
    /// Exactly these chunks per shard.
    Explicit(ChunksPerShard),
}

impl Default for ShardPolicy {
    fn default() -> Self {
        ShardPolicy::Auto {
            target_bytes: DEFAULT_TARGET_BYTES,
        }
    }
}

/// An explicit chunks-per-shard setting: `4` (every axis) or `4,4,2` (axis by axis).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunksPerShard {
    Uniform(u64),
    PerAxis(Vec<u64>),
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    #[error("chunks per shard must be positive whole numbers separated by commas, got {0:?}")]
    Syntax(String),
    #[error("chunks per shard gives {given} axes, the array has {ndim}")]
    RankMismatch { given: usize, ndim: usize },
}

impl FromStr for ChunksPerShard {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let values: Vec<u64> = s
            .split(',')
            .map(|p| p.trim().parse::<u64>().ok().filter(|&v| v > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| PolicyError::Syntax(s.to_string()))?;
        Ok(match values.as_slice() {
            [one] => ChunksPerShard::Uniform(*one),
            _ => ChunksPerShard::PerAxis(values),
        })
    }
}

impl fmt::Display for ChunksPerShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunksPerShard::Uniform(n) => write!(f, "{n}"),
            ChunksPerShard::PerAxis(v) => {
                let parts: Vec<String> = v.iter().map(u64::to_string).collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

impl ShardPolicy {
    /// Chunks per shard for an array of `shape` with inner chunks of `chunk_shape`.
    /// `item_size` is bytes per element; types without a fixed size count as 1 byte.
    ///
    /// `Auto` starts from one chunk per shard and, round by round, doubles each axis in
    /// turn (first axis first), capping it at the array's chunk-grid extent on that axis and
    /// skipping a doubling that would pass the target. It stops when a round grows nothing.
    /// The result is deterministic, never less than 1 on any axis, and never more than
    /// `AUTO_MAX_CHUNKS_PER_SHARD` chunks in all.
    pub fn chunks_per_shard(
        &self,
        shape: &[u64],
        chunk_shape: &[u64],
        item_size: Option<u64>,
    ) -> Result<Vec<u64>, PolicyError> {
        let ndim = shape.len();
        match self {
            ShardPolicy::Explicit(ChunksPerShard::Uniform(n)) => Ok(vec![*n; ndim]),
            ShardPolicy::Explicit(ChunksPerShard::PerAxis(v)) if v.len() == ndim => Ok(v.clone()),
            ShardPolicy::Explicit(ChunksPerShard::PerAxis(v)) => Err(PolicyError::RankMismatch {
                given: v.len(),
                ndim,
            }),
            ShardPolicy::Auto { target_bytes } => {
                let chunk_bytes = chunk_shape
                    .iter()
                    .fold(item_size.unwrap_or(1).max(1), |acc, &c| {
                        acc.saturating_mul(c.max(1))
                    });
                let extent: Vec<u64> = shape
                    .iter()
                    .zip(chunk_shape)
                    .map(|(&s, &c)| grid::ceil_div(s, c).max(1))
                    .collect();
                let mut cps = vec![1u64; ndim];
                let bytes = |cps: &[u64]| {
                    cps.iter()
                        .fold(chunk_bytes, |acc, &n| acc.saturating_mul(n))
                };
                loop {
                    let mut grew = false;
                    for axis in 0..ndim {
                        let next = (cps[axis] * 2).min(extent[axis]);
                        if next == cps[axis] {
                            continue;
                        }
                        let old = cps[axis];
                        cps[axis] = next;
                        let chunks = cps.iter().fold(1u64, |a, &n| a.saturating_mul(n));
                        if bytes(&cps) > *target_bytes || chunks > AUTO_MAX_CHUNKS_PER_SHARD {
                            cps[axis] = old;
                        } else {
                            grew = true;
                        }
                    }
                    if !grew {
                        return Ok(cps);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn auto(target: u64) -> ShardPolicy {
        ShardPolicy::Auto {
            target_bytes: target,
        }
    }

    #[test]
    fn auto_reaches_the_target_evenly() {
        // 512^3 uint8 in 64^3 chunks (256 KiB): 8x8x8 chunks = 128 MiB exactly.
        let p = ShardPolicy::default();
        assert_eq!(
            p.chunks_per_shard(&[512; 3], &[64; 3], Some(1)).unwrap(),
            vec![8, 8, 8]
        );
        // 1 MiB target with 256 KiB chunks: four chunks, spread over two axes.
        assert_eq!(
            auto(MIB)
                .chunks_per_shard(&[512; 3], &[64; 3], Some(1))
                .unwrap(),
            vec![2, 2, 1]
        );
    }

    #[test]
    fn auto_never_passes_the_grid_extent() {
        // Axis 0 has only 3 chunks; axis 1 has 1.
        assert_eq!(
            ShardPolicy::default()
                .chunks_per_shard(&[30, 5, 1000], &[10, 5, 10], Some(8))
                .unwrap(),
            vec![3, 1, 100]
        );
        // A chunk bigger than the target still gives one chunk per shard.
        assert_eq!(
            auto(10)
                .chunks_per_shard(&[100, 100], &[50, 50], Some(4))
                .unwrap(),
            vec![1, 1]
        );
        assert_eq!(
            ShardPolicy::default()
                .chunks_per_shard(&[], &[], Some(4))
                .unwrap(),
            Vec::<u64>::new()
        );
        assert_eq!(
            ShardPolicy::default()
                .chunks_per_shard(&[0], &[5], Some(4))
                .unwrap(),
            vec![1]
        );
    }

    #[test]
    fn auto_caps_the_number_of_tiny_chunks() {
        let cps = ShardPolicy::default()
            .chunks_per_shard(&[1 << 20, 1 << 20], &[1, 1], Some(1))
            .unwrap();
        assert_eq!(cps.iter().product::<u64>(), AUTO_MAX_CHUNKS_PER_SHARD);
    }

    #[test]
    fn item_size_counts() {
        let cps8 = auto(64 * MIB)
            .chunks_per_shard(&[4096, 4096], &[256, 256], Some(8))
            .unwrap();
        let cps1 = auto(64 * MIB)
            .chunks_per_shard(&[4096, 4096], &[256, 256], Some(1))
            .unwrap();
        assert_eq!(cps8, vec![16, 8]);
        assert_eq!(cps1, vec![16, 16]);
    }

    #[test]
    fn explicit_overrides_and_parses() {
        let uniform: ChunksPerShard = "4".parse().unwrap();
        assert_eq!(
            ShardPolicy::Explicit(uniform.clone())
                .chunks_per_shard(&[8, 8], &[1, 1], Some(1))
                .unwrap(),
            vec![4, 4]
        );
        assert_eq!(uniform.to_string(), "4");
        let per: ChunksPerShard = "4, 2,1".parse().unwrap();
        assert_eq!(per, ChunksPerShard::PerAxis(vec![4, 2, 1]));
        assert!(matches!(
            ShardPolicy::Explicit(per).chunks_per_shard(&[8, 8], &[1, 1], None),
            Err(PolicyError::RankMismatch { given: 3, ndim: 2 })
        ));
        for bad in ["", "0", "4,x", "-1", "4,,4"] {
            assert!(bad.parse::<ChunksPerShard>().is_err(), "{bad}");
        }
    }
}
