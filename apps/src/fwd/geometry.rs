//! The data queues' shape from `ntb-fwd`'s flags, fitted to the device's
//! window. Both sides derive it the same way from the same flags and the
//! same window, and the transport's handshake refuses a mismatch.

use anyhow::{Result, bail};
use ntbdk_pmd::transport::{DataQueues, Geometry};

/// `--nb-desc` when not given (DPDK `ntb_fwd`'s default).
pub const DEFAULT_NB_DESC: u32 = 1024;
/// The fewest descriptors per queue the transport accepts.
pub const MIN_NB_DESC: u32 = 16;

/// What the flags ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Queues (`--qp`).
    pub queues: u16,
    /// Descriptors per queue (`--nb-desc`; `None`: the default, halved
    /// until it fits the window).
    pub nb_desc: Option<u32>,
    /// Bytes per buffer (`--buf-size`).
    pub buf_size: u32,
}

impl Shape {
    /// The data queues of this shape with `nb_desc` descriptors each.
    fn with_nb_desc(&self, nb_desc: u32) -> DataQueues {
        DataQueues {
            count: self.queues,
            nb_desc,
            buf_size: self.buf_size,
        }
    }
}

/// The largest `nb_desc`, a power of two from `start` down to
/// [`MIN_NB_DESC`], whose window for `shape` on `ports` ports, rounded up
/// to a multiple of `round`, is at most `limit`; `None` when none is.
fn largest_fitting(
    ports: u16,
    shape: &Shape,
    start: u32,
    limit: usize,
    round: usize,
) -> Result<Option<u32>> {
    let mut nb = start;
    while nb >= MIN_NB_DESC {
        if window_needed(ports, shape.with_nb_desc(nb))?.next_multiple_of(round) <= limit {
            return Ok(Some(nb));
        }
        nb /= 2;
    }
    Ok(None)
}

/// The transport geometry of `ports` ports with `data` queues: the queue
/// pair kept small (ntb-fwd moves its data on the data queues only).
pub fn geometry(ports: u16, data: DataQueues) -> Geometry {
    Geometry {
        data,
        ..Geometry::small(ports)
    }
}

/// The window size `ports` ports with `data` queues need (no regions).
pub fn window_needed(ports: u16, data: DataQueues) -> Result<usize> {
    Ok(geometry(ports, data).layout()?.window_size_for(0))
}

/// The largest window of an emulated fabric `ntb-fwd` creates (each host's
/// window is memory of the machine).
pub const MAX_EMU_WINDOW: usize = 1 << 30;

/// The window (whole MiB) of an emulated fabric of `ports` ports to create
/// for `shape`: the default `--nb-desc` halves until it fits
/// [`MAX_EMU_WINDOW`], as [`plan_geometry`] halves it for a device's fixed
/// windows (the side that joins derives the same from the window); a
/// shape that does not fit even so is an error saying what to cut.
///
/// ```
/// use ntbdk_apps::fwd::{MAX_EMU_WINDOW, Shape, emu_window};
/// let big = Shape { queues: 16, nb_desc: None, buf_size: 65536 };
/// assert!(emu_window(2, &big).unwrap() <= MAX_EMU_WINDOW);
/// assert!(emu_window(2, &Shape { nb_desc: Some(1024), ..big }).is_err());
/// ```
pub fn emu_window(ports: u16, shape: &Shape) -> Result<usize> {
    const MIB: usize = 1 << 20;
    let nb = match shape.nb_desc {
        Some(nb) => nb,
        None => largest_fitting(ports, shape, DEFAULT_NB_DESC, MAX_EMU_WINDOW, MIB)?
            .unwrap_or(MIN_NB_DESC),
    };
    let w = window_needed(ports, shape.with_nb_desc(nb))?.next_multiple_of(MIB);
    if w > MAX_EMU_WINDOW {
        bail!(
            "--qp {} --nb-desc {nb} --buf-size {} need {w}-byte windows, more than the \
             {MAX_EMU_WINDOW} an emulated fabric gets: use fewer queues, descriptors or bytes \
             per buffer",
            shape.queues,
            shape.buf_size
        );
    }
    Ok(w)
}

/// The geometry for `shape` on a device of `ports` ports with windows of
/// `window` bytes, and a note when the default `--nb-desc` was shrunk to
/// fit.
///
/// ```
/// use ntbdk_apps::fwd::{Shape, plan_geometry};
/// let shape = Shape { queues: 1, nb_desc: None, buf_size: 2048 };
/// let (g, note) = plan_geometry(2, 64 << 20, &shape).unwrap();
/// assert_eq!((g.data.nb_desc, note), (1024, None));
/// let (g, note) = plan_geometry(4, 4 << 20, &shape).unwrap();
/// assert!(g.data.nb_desc < 1024 && note.is_some());
/// let fixed = Shape { nb_desc: Some(1024), ..shape };
/// assert!(plan_geometry(4, 4 << 20, &fixed).is_err());
/// ```
pub fn plan_geometry(
    ports: u16,
    window: usize,
    shape: &Shape,
) -> Result<(Geometry, Option<String>)> {
    let data = |nb_desc| shape.with_nb_desc(nb_desc);
    let describe = |nb: u32| {
        format!(
            "--qp {} --nb-desc {nb} --buf-size {}",
            shape.queues, shape.buf_size
        )
    };
    // The largest power-of-two nb_desc that fits, if any.
    let start = DEFAULT_NB_DESC.max(shape.nb_desc.unwrap_or(0));
    let fit = largest_fitting(ports, shape, start, window, 1)?;
    match (shape.nb_desc, fit) {
        (Some(want), _) => {
            let need = window_needed(ports, data(want))?;
            if need > window {
                let hint = match fit {
                    Some(f) => format!("--nb-desc {f} fits"),
                    None => "no --nb-desc fits: use a smaller --buf-size or fewer --qp".into(),
                };
                bail!(
                    "{} need a {need}-byte window on a {ports}-port device, and its windows \
                     are {window} bytes: {hint} (give the same flags on both sides)",
                    describe(want)
                );
            }
            Ok((geometry(ports, data(want)), None))
        }
        (None, Some(f)) => {
            let note = (f != DEFAULT_NB_DESC).then(|| {
                format!(
                    "the default --nb-desc {DEFAULT_NB_DESC} does not fit the {window}-byte \
                     window of this {ports}-port device: using {} (the other side derives the \
                     same from the same window; give --nb-desc to choose)",
                    describe(f)
                )
            });
            Ok((geometry(ports, data(f)), note))
        }
        (None, None) => bail!(
            "{} queue(s) of {} B buffers do not fit the {window}-byte window of this {ports}-port \
             device even with --nb-desc {MIN_NB_DESC}: use a smaller --buf-size or fewer --qp",
            shape.queues,
            shape.buf_size
        ),
    }
}
