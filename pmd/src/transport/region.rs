//! The address-range table: registered regions of our window's region area,
//! each a key → (extents, length, permissions).
//!
//! Regions are where data is placed directly (no second copy). A region may be
//! built from scattered extents of the area; an SGL naming it lists them.
//! Every access a peer asks for is resolved here, against the key, the
//! permissions and the region's length, before a byte moves.
//!
//! Where the device keeps per-peer grants (see
//! [`NtbDevice::grant_range`]), the table also makes each region's extents
//! writable by exactly its protection domain (every peer, for a region
//! open to all) while it is registered — and, for a region being revoked,
//! until the revocation completes — so a peer that ignores the protocol
//! still cannot store into another domain's regions.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use crate::hw::{GrantId, NtbDevice, Port};

use super::idhash::IdMap;

use super::error::{Result, TransportError};
use super::key::{Access, RegionKey};

/// Allocation granularity of the region area (a cache line).
pub const GRAIN: u64 = 64;

/// Bytes of the region area a region of `len` bytes takes: whole grains.
pub(crate) fn footprint(len: u32) -> u64 {
    u64::from(len).next_multiple_of(GRAIN)
}

/// Window extents `(offset, len)` of a resolved range, inline when there is
/// only one (receive buffers usually are contiguous: no allocation per
/// posted receive).
#[derive(Debug)]
pub(crate) enum Extents {
    /// One contiguous extent.
    One([(u64, u64); 1]),
    /// Several, in transfer order.
    Many(Vec<(u64, u64)>),
}

impl Extents {
    /// Extents from a list (inline when it has one entry).
    pub fn from_vec(v: Vec<(u64, u64)>) -> Self {
        match v.as_slice() {
            [one] => Extents::One([*one]),
            _ => Extents::Many(v),
        }
    }

    /// The extents, in transfer order.
    #[inline]
    pub fn as_slice(&self) -> &[(u64, u64)] {
        match self {
            Extents::One(a) => a,
            Extents::Many(v) => v,
        }
    }
}

/// A deregistered region waiting for peers to acknowledge its revocation:
/// its extents, the peers still pending, and its grants.
type Revoking = (Vec<(u64, u64)>, Vec<Port>, Vec<Grant>);

/// A grant of one extent, to one peer or (`None`) to every peer.
type Grant = (Option<Port>, GrantId);

/// The device that enforces regions' grants, and our window on it.
struct Granter {
    dev: Arc<dyn NtbDevice>,
    mw: usize,
}

impl std::fmt::Debug for Granter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Granter").field("mw", &self.mw).finish()
    }
}

/// One registered region.
#[derive(Debug, Clone)]
pub struct Region {
    /// Its length in bytes.
    pub len: u64,
    /// Its permissions.
    pub access: Access,
    /// Window extents `(offset, len)`, in region order.
    pub extents: Vec<(u64, u64)>,
    /// Its protection domain: the peers that may access it remotely (none
    /// listed: every peer).
    pub peers: Option<Box<[Port]>>,
    /// The peers it was advertised to for one-sided writes.
    pub advertised: Vec<Port>,
    /// The device's grants of its extents to its domain.
    grants: Vec<Grant>,
    /// This registration's number, never reused (a key can be, once
    /// retired): what an operation served over the region checks it is
    /// still on.
    pub serial: u64,
}

impl Region {
    /// Whether `peer` is in the region's protection domain.
    #[inline]
    pub fn admits(&self, peer: Port) -> bool {
        self.peers.as_ref().is_none_or(|ps| ps.contains(&peer))
    }

    /// The window extents covering bytes `off..off+len` of the region.
    pub fn slice(&self, off: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let (mut pos, end) = (0u64, off.saturating_add(len));
        for &(eo, el) in &self.extents {
            let (s, e) = (pos.max(off), (pos + el).min(end));
            if s < e {
                out.push((eo + (s - pos), e - s));
            }
            pos += el;
            if pos >= end {
                break;
            }
        }
        out
    }
}

/// Regions one peer may have advertised to us at once (each an entry of
/// `Conn::learn_region`'s table); far more than a region area holds at
/// any useful size.
pub(crate) const MAX_REMOTE_REGIONS: usize = 1 << 16;

/// Most regions advertised to one peer at once: half of what it can learn
/// ([`MAX_REMOTE_REGIONS`]) and half of the queue's backlog, since all of
/// them go out on connecting: more overflowed the queue to the peer and
/// reset the connection, again at each reconnection; this many leaves the
/// other half for everything else sent meanwhile.
pub(crate) const MAX_ADVERTISED: usize = MAX_REMOTE_REGIONS / 2;

/// How many keys of regions whose revocation ended the table remembers
/// (see `RegionTable::retired`).
pub const RETIRED_KEPT: usize = 64;

/// The region table and the allocator of the region area.
#[derive(Debug)]
pub struct RegionTable {
    free: BTreeMap<u64, u64>,
    regions: IdMap<u32, Region>,
    /// Deregistered regions still advertised to peers that have not
    /// acknowledged the revocation: key → (extents, peers pending). Their
    /// bytes are not handed out again until the last peer acknowledges or
    /// is gone, so a late one-sided write never lands in reused memory.
    revoking: IdMap<u32, Revoking>,
    /// The keys of the last [`RETIRED_KEPT`] regions whose revocation
    /// ended, oldest first: a write-with-immediate notice sent before the
    /// peer acknowledged can still arrive after (acknowledgements are taken
    /// before notices), and is then not the writer's fault.
    retired: std::collections::VecDeque<u32>,
    /// Rendezvous writes we granted and serve, per region key: the peer
    /// writes into the extents we sent it until its `Done` (or the
    /// operation's deadline, or its end), so a region deregistered meanwhile
    /// keeps its bytes (in `revoking`) until the last of them ends.
    writers: IdMap<u32, u32>,
    /// Keys are a permutation of a counter keyed with OS randomness (std's
    /// `RandomState`; see [`permute`](Self::permute)): unpredictable to a
    /// peer, and no key comes twice in 2^32 registrations (past that, one
    /// that names a live region is drawn again).
    keys: RandomState,
    /// Keys drawn so far.
    minted: u64,
    /// Where regions' grants are made (none: the device keeps none).
    granter: Option<Granter>,
    /// Regions each peer may know from our advertisements (advertised to
    /// it, their revocation not yet acknowledged): at most
    /// [`MAX_ADVERTISED`].
    advertised_count: IdMap<Port, usize>,
}

/// The window offset of `off..off+len` of a region whose first extent is
/// `(window offset, length)`, when the range is not empty and lies in that
/// extent.
#[inline]
pub(crate) fn in_extent((eo, el): (u64, u64), off: u64, len: u64) -> Option<u64> {
    let end = off.checked_add(len)?;
    (len > 0 && end <= el).then_some(eo + off)
}

impl Drop for RegionTable {
    /// The transport is gone: nothing it registered stays granted.
    fn drop(&mut self) {
        let live = self.regions.values().map(|r| &r.grants);
        let revoking = self.revoking.values().map(|(_, _, g)| g);
        for g in live.chain(revoking) {
            self.withdraw(g);
        }
    }
}

impl RegionTable {
    /// A table over the window bytes `start..end`.
    pub fn new(start: u64, end: u64) -> Self {
        let start = start.next_multiple_of(GRAIN);
        let end = end / GRAIN * GRAIN;
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Self {
            free,
            regions: IdMap::default(),
            revoking: IdMap::default(),
            retired: std::collections::VecDeque::new(),
            writers: IdMap::default(),
            keys: RandomState::new(),
            minted: 0,
            granter: None,
            advertised_count: IdMap::default(),
        }
    }

    /// The same table, granting each region's extents to its domain on
    /// `dev`'s window `mw` (see the module docs).
    pub fn with_grants(mut self, dev: Arc<dyn NtbDevice>, mw: usize) -> Self {
        self.granter = Some(Granter { dev, mw });
        self
    }

    /// Grants `extents` to each of `peers` (every peer: `None`); on a
    /// refusal, withdraws what it granted and returns the error.
    fn grant(&self, extents: &[(u64, u64)], peers: Option<&[Port]>) -> Result<Vec<Grant>> {
        let Some(g) = &self.granter else {
            return Ok(Vec::new());
        };
        let who: Vec<Option<Port>> = match peers {
            None => vec![None],
            Some(ps) => ps.iter().map(|&p| Some(p)).collect(),
        };
        let mut ids = Vec::with_capacity(extents.len() * who.len());
        for &(s, l) in extents {
            for &p in &who {
                match g.dev.grant_range(g.mw, s as usize, l as usize, p) {
                    Ok(id) => ids.extend(id.map(|id| (p, id))),
                    Err(e) => {
                        self.withdraw(&ids);
                        return Err(e.into());
                    }
                }
            }
        }
        Ok(ids)
    }

    /// Withdraws `grants` (a region's bytes leave its domain).
    fn withdraw(&self, grants: &[Grant]) {
        if let Some(g) = &self.granter {
            for &(_, id) in grants {
                g.dev.withdraw_range(g.mw, id);
            }
        }
    }

    /// Bytes free in the area.
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Registers a region of `len` bytes that every peer may access as
    /// `access` allows. With `max_extent`, it is built from extents of at
    /// most that many bytes (scattered where the area is).
    pub fn register(
        &mut self,
        len: u64,
        access: Access,
        max_extent: Option<u64>,
    ) -> Result<RegionKey> {
        self.register_for(len, access, max_extent, None)
    }

    /// Like [`register`](Self::register), remotely accessible only by
    /// `peers` (its protection domain) when given.
    pub fn register_for(
        &mut self,
        len: u64,
        access: Access,
        max_extent: Option<u64>,
        peers: Option<&[Port]>,
    ) -> Result<RegionKey> {
        if len == 0 {
            return Err(TransportError::EmptyRegion);
        }
        let free = self.free_bytes();
        let need = match len.checked_next_multiple_of(GRAIN) {
            Some(n) if n <= free => n,
            _ => return Err(TransportError::RegionAreaFull { len, free }),
        };
        let max_ext = max_extent.map_or(need, |m| m.max(GRAIN) / GRAIN * GRAIN);
        let mut extents = Vec::new();
        // Contiguous if we can.
        if max_ext >= need
            && let Some((&s, &l)) = self.free.iter().find(|&(_, &l)| l >= need)
        {
            self.take(s, l, need);
            extents.push((s, need));
        } else {
            let mut left = need;
            while left > 0 {
                let Some((&s, &l)) = self.free.iter().next() else {
                    break;
                };
                let piece = l.min(left).min(max_ext);
                self.take(s, l, piece);
                extents.push((s, piece));
                left -= piece;
            }
        }
        let grants = match self.grant(&extents, peers) {
            Ok(g) => g,
            Err(e) => {
                for (s, l) in extents {
                    self.release(s, l);
                }
                return Err(e);
            }
        };
        // The extents keep the grain padding (it is allocated and returned
        // with them); the region's `len` is where its bytes end.
        let key = self.mint_key();
        self.regions.insert(
            key,
            Region {
                len,
                access,
                extents,
                peers: peers.map(Box::from),
                advertised: Vec::new(),
                grants,
                serial: self.minted,
            },
        );
        Ok(RegionKey(key))
    }

    /// A fresh key: nonzero, not naming a live region, unpredictable.
    fn mint_key(&mut self) -> u32 {
        loop {
            self.minted += 1;
            let k = self.permute(self.minted as u32);
            if k != 0 && !self.regions.contains_key(&k) && !self.revoking.contains_key(&k) {
                return k;
            }
        }
    }

    /// A keyed permutation of the `u32`s: a four-round Feistel network
    /// over 16-bit halves whose round function is the table's random hash.
    /// Distinct counters give distinct keys, so a peer holding a stale key
    /// never names a region registered after it (a hash of the counter,
    /// as before, repeated a key among about a million registrations once
    /// in two), and the sequence shows nothing of the counter.
    fn permute(&self, x: u32) -> u32 {
        let (mut left, mut right) = ((x >> 16) as u16, x as u16);
        for round in 0..4u8 {
            let f = self.keys.hash_one((round, right)) as u16;
            (left, right) = (right, left ^ f);
        }
        (u32::from(left) << 16) | u32::from(right)
    }

    fn take(&mut self, start: u64, hole: u64, n: u64) {
        self.free.remove(&start);
        if hole > n {
            self.free.insert(start + n, hole - n);
        }
    }

    /// Deregisters a region, withdrawing its grants and returning its
    /// extents to the area — at once, or (a region advertised for
    /// one-sided writes) once every peer it was advertised to has
    /// acknowledged the revocation or is gone. Returns those peers, to whom
    /// a revocation must be sent.
    pub fn deregister(&mut self, key: RegionKey) -> Result<Vec<Port>> {
        let r = self
            .regions
            .remove(&key.0)
            .ok_or(TransportError::NoSuchRegion(key))?;
        if r.advertised.is_empty() && !self.writers.contains_key(&key.0) {
            self.retire(r.extents, &r.grants);
            return Ok(Vec::new());
        }
        let peers = r.advertised.clone();
        self.revoking
            .insert(key.0, (r.extents, r.advertised, r.grants));
        Ok(peers)
    }

    /// A region's end: its grants withdrawn, then its bytes free again.
    fn retire(&mut self, extents: Vec<(u64, u64)>, grants: &[Grant]) {
        self.withdraw(grants);
        for (s, l) in extents {
            self.release(s, l);
        }
    }

    /// Whether `key` names a region deregistered lately: its revocation
    /// still waits for peers, or is one of the last [`RETIRED_KEPT`] to
    /// have ended.
    pub fn was_deregistered(&self, key: RegionKey) -> bool {
        self.revoking.contains_key(&key.0) || self.retired.contains(&key.0)
    }

    /// `peer` acknowledged the revocation of `key` (or is gone): what was
    /// granted to it alone is withdrawn (once no rendezvous write into the
    /// region is served); once no peer is pending, the rest of the region's
    /// grants are, and its bytes return to the area. Whether `peer` was
    /// one the revocation waited for (an honest peer acknowledges only
    /// those).
    pub fn revoke_acked(&mut self, key: RegionKey, peer: Port) -> bool {
        let Some((_, pending, grants)) = self.revoking.get_mut(&key.0) else {
            return false;
        };
        let before = pending.len();
        pending.retain(|&p| p != peer);
        let was_pending = pending.len() < before;
        if was_pending && let Some(n) = self.advertised_count.get_mut(&peer) {
            *n = n.saturating_sub(1);
        }
        let done = pending.is_empty();
        // While a rendezvous write into the region is served, its copies
        // may still come (set aside while our grant table was mid-edit): the
        // peer's grants stay until the last ends, and go with the rest then.
        if !self.writers.contains_key(&key.0) {
            let (its, rest): (Vec<Grant>, Vec<Grant>) = std::mem::take(grants)
                .into_iter()
                .partition(|&(p, _)| p == Some(peer));
            *grants = rest;
            self.withdraw(&its);
        }
        if done {
            self.retire_if_done(key);
        }
        was_pending
    }

    /// Retires a deregistered region once no peer is pending and no write
    /// into it is served.
    fn retire_if_done(&mut self, key: RegionKey) {
        let pending = self
            .revoking
            .get(&key.0)
            .is_some_and(|(_, p, _)| !p.is_empty());
        if pending || self.writers.contains_key(&key.0) {
            return;
        }
        if let Some((extents, _, grants)) = self.revoking.remove(&key.0) {
            self.retire(extents, &grants);
            if self.retired.len() == RETIRED_KEPT {
                self.retired.pop_front();
            }
            self.retired.push_back(key.0);
        }
    }

    /// A rendezvous write into region `key` is served from now on: its
    /// bytes stay out of reuse until [`write_ended`](Self::write_ended).
    pub fn write_served(&mut self, key: RegionKey) {
        *self.writers.entry(key.0).or_default() += 1;
    }

    /// A served write into region `key` ended (done, expired or its peer
    /// gone): a region deregistered meanwhile is retired after its last.
    pub fn write_ended(&mut self, key: RegionKey) {
        let Some(n) = self.writers.get_mut(&key.0) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.writers.remove(&key.0);
            self.retire_if_done(key);
        }
    }

    /// Forgets `peer` (its connection ended): its advertisements are void,
    /// and revocations it had not acknowledged complete.
    pub fn forget_peer(&mut self, peer: Port) {
        for r in self.regions.values_mut() {
            r.advertised.retain(|&p| p != peer);
        }
        let keys: Vec<u32> = self.revoking.keys().copied().collect();
        for k in keys {
            self.revoke_acked(RegionKey(k), peer);
        }
        self.advertised_count.remove(&peer);
    }

    /// The regions to advertise to `peer` now (see
    /// [`advertise_one`](Self::advertise_one)), marked advertised.
    pub fn advertise_to(&mut self, peer: Port) -> Vec<(RegionKey, u64, u32)> {
        let keys: Vec<u32> = self.regions.keys().copied().collect();
        keys.into_iter()
            .filter_map(|k| self.advertise_one(RegionKey(k), peer))
            .collect()
    }

    /// Whether region `key` is to be advertised to `peer` now (remote-write,
    /// contiguous, in its domain, not yet advertised to it, and the peer
    /// knows fewer than [`MAX_ADVERTISED`] of ours); if so, marks it
    /// advertised and returns `(key, window offset, length)`. A region not
    /// advertised stays open to the peer's rendezvous writes.
    pub fn advertise_one(&mut self, key: RegionKey, peer: Port) -> Option<(RegionKey, u64, u32)> {
        let known = self.advertised_count.get(&peer).copied().unwrap_or(0);
        let r = self.regions.get_mut(&key.0)?;
        let eligible = r.extents.len() == 1
            && r.access.contains(Access::REMOTE_WRITE)
            && r.admits(peer)
            && r.len <= u64::from(u32::MAX)
            && !r.advertised.contains(&peer)
            && known < MAX_ADVERTISED;
        if !eligible {
            return None;
        }
        r.advertised.push(peer);
        *self.advertised_count.entry(peer).or_insert(0) += 1;
        Some((key, r.extents[0].0, r.len as u32))
    }

    fn release(&mut self, mut s: u64, mut l: u64) {
        if let Some((&ps, &pl)) = self.free.range(..s).next_back()
            && ps + pl == s
        {
            self.free.remove(&ps);
            s = ps;
            l += pl;
        }
        if let Some(&nl) = self.free.get(&(s + l)) {
            self.free.remove(&(s + l));
            l += nl;
        }
        self.free.insert(s, l);
    }

    /// The region named `key`.
    pub fn get(&self, key: RegionKey) -> Option<&Region> {
        self.regions.get(&key.0)
    }

    /// Grant-table entries region `key` holds: one per extent and peer it
    /// is granted to, none where the device keeps no table.
    pub fn grant_entries(&self, key: RegionKey) -> usize {
        self.get(key).map_or(0, |r| r.grants.len())
    }

    /// The window extents of the first `len` bytes of region `key` (none
    /// when it is not registered): storage the transport allocated itself
    /// and now hands to a peer or copies from.
    pub fn extents(&self, key: RegionKey, len: u32) -> Vec<(u64, u64)> {
        self.get(key)
            .map(|r| r.slice(0, u64::from(len)))
            .unwrap_or_default()
    }

    /// Resolves `off..off+len` of region `key` for `peer`'s remote access
    /// needing `need`: as [`resolve`](Self::resolve), and `peer` must be in
    /// the region's protection domain.
    pub fn resolve_remote(
        &self,
        peer: Port,
        key: RegionKey,
        off: u64,
        len: u64,
        need: Access,
    ) -> Result<Vec<(u64, u64)>> {
        Ok(self.admitted(peer, key, off, len, need)?.slice(off, len))
    }

    /// The region, when `peer` may access `off..off+len` of it as `need`
    /// says: [`check`](Self::check), and `peer` in its protection domain
    /// (without resolving the range's extents: a served read walks the
    /// region's own).
    pub fn admitted(
        &self,
        peer: Port,
        key: RegionKey,
        off: u64,
        len: u64,
        need: Access,
    ) -> Result<&Region> {
        let r = self.check(key, off, len, need)?;
        if !r.admits(peer) {
            return Err(TransportError::NotInDomain { key, peer });
        }
        Ok(r)
    }

    /// Resolves `off..off+len` of region `key` for an access needing
    /// `need`: the window extents, or why not.
    pub fn resolve(
        &self,
        key: RegionKey,
        off: u64,
        len: u64,
        need: Access,
    ) -> Result<Vec<(u64, u64)>> {
        Ok(self.check(key, off, len, need)?.slice(off, len))
    }

    /// The first extent (window offset, length) of region `key` when the
    /// access is allowed (`None` otherwise, or when there is no such
    /// region): for many ranges of one region checked against it, as
    /// [`contiguous`](Self::contiguous) checks one. Its length stops at the
    /// region's end: the grain padding after it is no part of the region.
    #[inline]
    pub(crate) fn first_extent(&self, key: RegionKey, need: Access) -> Option<(u64, u64)> {
        let r = self.regions.get(&key.0)?;
        let &(at, len) = r.extents.first()?;
        r.access.contains(need).then_some((at, len.min(r.len)))
    }

    /// The window offset of `off..off+len` of region `key` when the access
    /// is allowed and the range lies in the region's first extent (every
    /// region in one piece); `None` otherwise, and the caller takes
    /// [`resolve_one`](Self::resolve_one) for the extents or the error. A
    /// small value in registers: the hot paths (receives, local reads)
    /// pay no error-sized result written to memory and read back.
    #[inline]
    pub(crate) fn contiguous(
        &self,
        key: RegionKey,
        off: u64,
        len: u64,
        need: Access,
    ) -> Option<u64> {
        in_extent(self.first_extent(key, need)?, off, len)
    }

    /// Like [`resolve`](Self::resolve), without allocating when the range
    /// lies in one extent.
    #[inline]
    pub(crate) fn resolve_one(
        &self,
        key: RegionKey,
        off: u64,
        len: u64,
        need: Access,
    ) -> Result<Extents> {
        let r = self.check(key, off, len, need)?;
        let mut pos = 0;
        for &(eo, el) in &r.extents {
            if off >= pos && off + len <= pos + el {
                return Ok(Extents::One([(eo + (off - pos), len)]));
            }
            pos += el;
        }
        Ok(Extents::from_vec(r.slice(off, len)))
    }

    #[inline]
    fn check(&self, key: RegionKey, off: u64, len: u64, need: Access) -> Result<&Region> {
        // Not `ok_or`: the error built on every call would be dropped by
        // an out-of-line call on the hot path (it has drop glue).
        let Some(r) = self.get(key) else {
            return Err(TransportError::NoSuchRegion(key));
        };
        if !r.access.contains(need) {
            return Err(TransportError::Permission {
                key,
                needed: need.name(),
            });
        }
        match off.checked_add(len) {
            Some(end) if end <= r.len && len > 0 => Ok(r),
            _ => Err(TransportError::OutOfRange {
                key,
                offset: off,
                len,
                region_len: r.len,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_checks_permission_and_bounds() {
        let mut t = RegionTable::new(4096, 4096 + 64 * 1024);
        let k = t
            .register(1000, Access::LOCAL | Access::REMOTE_WRITE, Some(256))
            .unwrap();
        // Built from extents of at most 256 bytes: a peer's write of 300
        // bytes at offset 200 lands in two of them.
        assert_eq!(
            t.resolve(k, 200, 300, Access::REMOTE_WRITE).unwrap().len(),
            2
        );
        // No remote read permission, and nothing beyond the region's end.
        assert!(t.resolve(k, 0, 10, Access::REMOTE_READ).is_err());
        assert!(t.resolve(k, 990, 20, Access::REMOTE_WRITE).is_err());
        assert_eq!(t.extents(k, 1000).iter().map(|e| e.1).sum::<u64>(), 1000);
        assert!(t.extents(RegionKey(0xdead), 10).is_empty());
    }

    #[test]
    fn huge_lengths_are_refused_not_wrapped() {
        let mut t = RegionTable::new(4096, 4096 + 64 * 100);
        for len in [u64::MAX, u64::MAX - 1, u64::MAX - 63] {
            assert!(matches!(
                t.register(len, Access::ALL, None),
                Err(TransportError::RegionAreaFull { .. })
            ));
        }
        assert_eq!(t.free_bytes(), 6400);
    }

    #[test]
    fn keys_are_distinct_nonzero_and_not_a_counter() {
        let mut t = RegionTable::new(0, 64 * 1024);
        let keys: Vec<u32> = (0..512)
            .map(|_| t.register(64, Access::ALL, None).unwrap().0)
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len());
        assert!(!keys.contains(&0));
        let steps_of_one = keys
            .windows(2)
            .filter(|w| w[1] == w[0].wrapping_add(1))
            .count();
        assert!(steps_of_one < 4, "{steps_of_one} consecutive keys");
    }

    #[test]
    fn keys_never_repeat_over_many_registrations() {
        // 2^20 registrations and deregistrations: a hash of the counter
        // would repeat a key about 128 times here (the birthday bound).
        let mut t = RegionTable::new(0, 64 * 64);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1 << 20 {
            let k = t.register(64, Access::ALL, None).unwrap();
            assert!(seen.insert(k.0), "key {:#x} handed out twice", k.0);
            t.deregister(k).unwrap();
        }
    }

    #[test]
    fn a_region_for_some_peers_refuses_the_others() {
        let mut t = RegionTable::new(0, 64 * 64);
        let k = t
            .register_for(64, Access::ALL, None, Some(&[2, 5]))
            .unwrap();
        assert!(t.resolve_remote(2, k, 0, 64, Access::REMOTE_WRITE).is_ok());
        assert!(t.resolve_remote(5, k, 0, 1, Access::REMOTE_READ).is_ok());
        assert!(matches!(
            t.resolve_remote(3, k, 0, 64, Access::REMOTE_WRITE),
            Err(TransportError::NotInDomain { peer: 3, .. })
        ));
        let open = t.register(64, Access::ALL, None).unwrap();
        assert!(
            t.resolve_remote(3, open, 0, 64, Access::REMOTE_WRITE)
                .is_ok()
        );
    }

    /// A peer's acknowledgement of a revocation withdraws its grant only
    /// once no rendezvous write into the region is served: a copy of that
    /// write set aside (our grant table mid-edit) must still be admitted.
    #[test]
    fn a_revoke_ack_keeps_the_grant_while_a_write_is_served() {
        let name = "revoke-ack";
        let (dir, fabric, [ours, _peer]) = crate::hw::emu::two_members(name);
        let dev: Arc<dyn NtbDevice> = Arc::new(ours);
        let granted = || fabric.status().slots[0].granted_ranges;
        let mut t = RegionTable::new(64 * 1024, 512 * 1024).with_grants(dev.clone(), 0);
        let before = granted();
        let k = t.register_for(4096, Access::ALL, None, Some(&[1])).unwrap();
        let with_region = granted();
        assert!(with_region > before, "{before} -> {with_region}");
        assert!(t.advertise_one(k, 1).is_some());
        t.write_served(k);
        assert_eq!(t.deregister(k).unwrap(), vec![1]);
        t.revoke_acked(k, 1);
        assert_eq!(granted(), with_region, "withdrawn while a write was served");
        t.write_ended(k);
        assert_eq!(granted(), before);
        drop((t, dev, _peer));
        drop(fabric);
        crate::hw::emu::EmuFabric::destroy_in(&dir, name).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn register_resolve_deregister() {
        let mut t = RegionTable::new(4096, 4096 + 64 * 100);
        let a = t.register(100, Access::ALL, None).unwrap();
        let ext = t.resolve(a, 10, 50, Access::REMOTE_WRITE).unwrap();
        assert_eq!(ext, vec![(4096 + 10, 50)]);
        assert!(t.resolve(a, 90, 20, Access::LOCAL_READ).is_err());
        assert!(t.resolve(RegionKey(99), 0, 1, Access::LOCAL_READ).is_err());
        let b = t.register(64, Access::LOCAL, None).unwrap();
        assert!(t.resolve(b, 0, 1, Access::REMOTE_READ).is_err());
        t.deregister(a).unwrap();
        t.deregister(b).unwrap();
        assert_eq!(t.free_bytes(), 6400);
        assert_eq!(t.free.len(), 1);
    }

    #[test]
    fn scattered_regions_slice_in_order() {
        let mut t = RegionTable::new(0, 64 * 64);
        let keys: Vec<_> = (0..8)
            .map(|_| t.register(64, Access::ALL, None).unwrap())
            .collect();
        for k in keys.iter().step_by(2) {
            t.deregister(*k).unwrap();
        }
        let big = t.register(64 * 10, Access::ALL, Some(64)).unwrap();
        let r = t.get(big).unwrap();
        assert_eq!(r.extents.len(), 10);
        assert_eq!(r.extents[0], (0, 64));
        assert_eq!(r.extents[1], (128, 64));
        let s = r.slice(60, 10);
        assert_eq!(s, vec![(60, 4), (128, 6)]);
        assert_eq!(r.slice(0, 640).iter().map(|e| e.1).sum::<u64>(), 640);
    }

    #[test]
    fn full_area_is_an_error() {
        let mut t = RegionTable::new(0, 128);
        assert!(matches!(
            t.register(200, Access::ALL, None),
            Err(TransportError::RegionAreaFull { .. })
        ));
    }
}
