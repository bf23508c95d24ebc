//! The result of a burst operation.

/// What a burst operation ([`Ring::enqueue_burst`](crate::Ring::enqueue_burst),
/// [`Ring::dequeue_burst`](crate::Ring::dequeue_burst)) did.
///
/// # Examples
///
/// ```
/// use ntbdk_ring::{Burst, Ring, RingMode};
///
/// let ring = Ring::<u64>::new(4, RingMode::MPMC)?;
/// assert_eq!(ring.enqueue_burst(&[1, 2, 3, 4, 5, 6]), Burst { n: 4, left: 0 });
/// let mut out = [0; 3];
/// assert_eq!(ring.dequeue_burst(&mut out), Burst { n: 3, left: 1 });
/// assert_eq!(out, [1, 2, 3]);
/// # Ok::<(), ntbdk_ring::RingError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// Number of elements moved: the first `n` of the slice were enqueued, or
    /// the first `n` of the output slice were filled.
    pub n: usize,
    /// After the operation: the free slots left (enqueue) or the elements
    /// remaining (dequeue), as this call saw them. The other side may have
    /// changed it since, and a `Single` side counts from its cached view, so
    /// it is a lower bound.
    pub left: usize,
}
