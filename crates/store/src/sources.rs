//! Where time and new ids come from. Nothing in Capstan reads the wall clock or mints an id
//! except through a [`Clock`] and an [`IdMint`], so a simulation that injects its own gets the
//! same run from the same seed, and a test can hold time still.

use capstan_engine::{IdSource, Millis};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// The time now, in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> Millis;
}

/// The wall clock (what a server runs on).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to (simulations and tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now: Millis) -> Self {
        Self(AtomicI64::new(now))
    }

    pub fn set(&self, now: Millis) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Millis) -> Millis {
        self.0.fetch_add(by, Ordering::SeqCst) + by
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// New ULIDs (ids sort in creation order).
pub trait IdMint: Send + Sync + 'static {
    fn next_ulid(&self) -> ulid::Ulid;
}

/// Random ULIDs (what a server runs on).
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomIds;

impl IdMint for RandomIds {
    fn next_ulid(&self) -> ulid::Ulid {
        ulid::Ulid::new()
    }
}

/// ULIDs from a counter mixed with a seed: the same seed mints the same ids in the same order
/// (and so gives the same claim order), and they still sort in creation order.
#[derive(Debug)]
pub struct SeededIds {
    seed: u64,
    counter: AtomicU64,
}

impl SeededIds {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            counter: AtomicU64::new(1),
        }
    }
}

impl IdMint for SeededIds {
    fn next_ulid(&self) -> ulid::Ulid {
        let counter = self.counter.fetch_add(1, Ordering::SeqCst);
        ulid::Ulid::from_parts(counter, (u128::from(self.seed) << 64) | u128::from(counter))
    }
}

/// A clock and an id mint, handed together to whatever needs either.
#[derive(Clone)]
pub struct Sources {
    pub clock: Arc<dyn Clock>,
    pub ids: Arc<dyn IdMint>,
}

impl Sources {
    pub fn new(clock: Arc<dyn Clock>, ids: Arc<dyn IdMint>) -> Self {
        Self { clock, ids }
    }

    /// The wall clock and random ids.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemClock), Arc::new(RandomIds))
    }

    pub fn now_ms(&self) -> Millis {
        self.clock.now_ms()
    }

    pub fn new_ulid(&self) -> ulid::Ulid {
        self.ids.next_ulid()
    }

    pub fn new_id(&self) -> String {
        self.ids.next_ulid().to_string()
    }

    /// An engine id source drawing on this mint (for a transition's `Cx`).
    pub fn id_source(&self) -> MintedIds<'_> {
        MintedIds(self.ids.as_ref())
    }
}

impl Default for Sources {
    fn default() -> Self {
        Self::system()
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

/// The engine's [`IdSource`] over an [`IdMint`].
pub struct MintedIds<'a>(&'a dyn IdMint);

impl IdSource for MintedIds<'_> {
    fn next_id(&mut self) -> String {
        self.0.next_ulid().to_string()
    }
}

/// What the store's transaction logic draws on besides the database: the limits, the sources
/// of time and ids, and the payload codec transitions read and write payloads with (a probe's
/// question and answer, memo merges) when the caller did not hand one.
#[derive(Clone)]
pub struct Env {
    pub limits: capstan_engine::Limits,
    pub sources: Sources,
    pub codec: Option<&'static dyn capstan_engine::MemoCodec>,
    /// Who hears of committed facts and commit times (shared by every clone of the store).
    pub observer: crate::observe::ObserverSlot,
    /// Recent dispatch per queue and fairness class (shared by every clone of the store).
    pub dispatch: std::sync::Arc<crate::dispatch_shares::DispatchShares>,
    /// Which queues have flow-control limits, as last read (shared by every clone).
    pub limited: std::sync::Arc<crate::limited_queues::LimitedQueues>,
    /// The polls parked on this node, for a transaction that makes a task ready to hand it to
    /// (shared by every clone).
    pub parked: std::sync::Arc<crate::parked_polls::ParkedPolls>,
    /// How long writes wait before they run (shared by every clone).
    pub write_delay: std::sync::Arc<crate::pressure::WriteDelay>,
}

impl Env {
    pub fn new(limits: capstan_engine::Limits) -> Self {
        Self {
            limits,
            sources: Sources::system(),
            codec: None,
            observer: Default::default(),
            dispatch: Default::default(),
            limited: Default::default(),
            parked: Default::default(),
            write_delay: Default::default(),
        }
    }

    /// A transition context at `now` drawing ids from `ids`, with this store's codec.
    pub fn cx<'a>(&'a self, now: Millis, ids: &'a mut MintedIds<'_>) -> capstan_engine::Cx<'a> {
        let mut cx = capstan_engine::Cx::new(now, ids, &self.limits);
        cx.memo = self.codec;
        cx
    }

    pub fn ids(&self) -> MintedIds<'_> {
        self.sources.id_source()
    }

    pub fn new_id(&self) -> String {
        self.sources.new_id()
    }

    pub fn now_ms(&self) -> Millis {
        self.sources.now_ms()
    }
}
