//! C-order arithmetic on n-dimensional grids, shared by the shard format and the Zarr model.

/// Number of cells of a grid; 1 for a 0-d grid. Saturates instead of overflowing: callers
/// that take sizes from files check them against a limit first (`MAX_CHUNKS_PER_SHARD`).
pub fn count(shape: &[u64]) -> usize {
    let n = shape.iter().fold(1u64, |acc, &e| acc.saturating_mul(e));
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Coordinates of the `pos`-th cell in C order.
pub fn unravel(mut pos: usize, shape: &[u64]) -> Vec<u64> {
    let mut coords = vec![0; shape.len()];
    for (c, &extent) in coords.iter_mut().zip(shape).rev() {
        let extent = extent.max(1) as usize;
        *c = (pos % extent) as u64;
        pos /= extent;
    }
    coords
}

/// C-order position of `coords`; the caller guarantees they lie inside `shape`.
pub fn ravel(coords: &[u64], shape: &[u64]) -> usize {
    coords.iter().zip(shape).fold(0usize, |acc, (&c, &extent)| {
        acc * extent as usize + c as usize
    })
}

pub fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

pub fn inside(coords: &[u64], shape: &[u64]) -> bool {
    coords.len() == shape.len() && coords.iter().zip(shape).all(|(c, s)| c < s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ravel_unravel_are_inverse_in_c_order() {
        let shape = [2, 3, 4];
        assert_eq!(count(&shape), 24);
        for pos in 0..24 {
            assert_eq!(ravel(&unravel(pos, &shape), &shape), pos);
        }
        assert_eq!(unravel(5, &shape), vec![0, 1, 1]);
        assert_eq!(unravel(23, &shape), vec![1, 2, 3]);
        assert_eq!(count(&[]), 1);
        assert_eq!(unravel(0, &[]), Vec::<u64>::new());
    }
}
