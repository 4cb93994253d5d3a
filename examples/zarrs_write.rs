//! Writes a 256³ uint16 array through a shardfs mount with the zarrs crate, one chunk at a
//! time, as an ordinary unsharded array: `cargo run --example zarrs_write -- /mnt/zarr`.
//! shardfs stores it sharded in BACKING.

use std::sync::Arc;

use zarrs::array::codec::ZstdCodec;
use zarrs::array::{ArrayBuilder, data_type};
use zarrs::filesystem::FilesystemStore;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mount = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/mnt/zarr".into());
    let store = Arc::new(FilesystemStore::new(mount)?);
    let array = ArrayBuilder::new(
        vec![256, 256, 256], // array shape
        vec![32, 32, 32],    // chunk shape: one file per chunk, as the writer sees it
        data_type::uint16(),
        0u16,
    )
    .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
    .build(store, "/zarrs.zarr")?;
    array.store_metadata()?;
    // Chunk (z, y, x) holds the value z * 64 + y * 8 + x everywhere.
    for z in 0..8u64 {
        for y in 0..8u64 {
            for x in 0..8u64 {
                let value = (z * 64 + y * 8 + x) as u16;
                array.store_chunk(&[z, y, x], vec![value; 32 * 32 * 32])?;
            }
        }
    }
    Ok(())
}
