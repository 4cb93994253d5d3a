//! A group `zarr.json` whose consolidated metadata describes sharded arrays: the mount serves
//! it with every such entry translated to its unsharded view.

use std::time::SystemTime;

use bytes::Bytes;

#[derive(Debug)]
pub struct GroupView {
    pub json: Bytes,
    pub mtime: SystemTime,
}
