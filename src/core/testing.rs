//! Documents the core's unit tests share (compiled for tests only).

/// A sharded array of four one-byte chunks, two per shard, index at the end.
pub const FOUR_BYTES_TWO_PER_SHARD: &str = r#"{"zarr_format":3,"node_type":"array","shape":[4],
  "data_type":"uint8",
  "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},
  "chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
  "fill_value":0,"codecs":[{"name":"sharding_indexed","configuration":{
    "chunk_shape":[1],"codecs":[{"name":"bytes"}],
    "index_codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"crc32c"}],
    "index_location":"end"}}]}"#;
