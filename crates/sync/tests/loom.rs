//! The loom models (see the crate docs). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p capstan-sync --release`; every interleaving of each
//! model's threads is explored, up to `LOOM_MAX_PREEMPTIONS` preemptions (3 unless set).
//! A lost wake-up or a caller never answered shows as loom's deadlock report; the rest as a
//! failed assertion.
#![cfg(loom)]

use capstan_sync::group_commit::{self, Backend, Ending, Job, Sender};
use capstan_sync::{KeyedLocks, KeyedWakeups, WakeHub};
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(model);
}

/// A one-way signal between two threads (loom's own `Notify` may wake spuriously).
#[derive(Default)]
struct Signal {
    given: Mutex<bool>,
    changed: Condvar,
}

impl Signal {
    fn give(&self) {
        *self.given.lock().unwrap() = true;
        self.changed.notify_all();
    }

    fn wait(&self) {
        let mut given = self.given.lock().unwrap();
        while !*given {
            given = self.changed.wait(given).unwrap();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    Workflow,
}

// ------------------------------------------------------------------------------------------
// 1, 2: the wake-up hubs

/// A poller subscribes, takes `notified()`, says so, and waits; once it has, the main thread
/// wakes the queue. Meanwhile another poller of the same queue comes and goes and a
/// client-chosen name passes (each drop may remove an entry). The poller must be woken: a
/// lost wake-up leaves it blocked, which loom reports as a deadlock.
#[test]
fn a_subscribed_poller_is_woken_whatever_comes_and_goes() {
    check(|| {
        let hub = WakeHub::<Kind>::default();
        let subscribed = Arc::new(Signal::default());
        let poller = thread::spawn({
            let (hub, subscribed) = (hub.clone(), subscribed.clone());
            move || {
                let queue = hub.channel("ns", Kind::Workflow, "q");
                let woken = queue.notified();
                subscribed.give();
                woken.wait();
            }
        });
        let passing = thread::spawn({
            let hub = hub.clone();
            move || {
                drop(hub.channel("ns", Kind::Workflow, "q"));
                drop(hub.channel("ns", Kind::Workflow, "client-chosen"));
            }
        });
        subscribed.wait();
        hub.wake("ns", Kind::Workflow, "q");
        poller.join().unwrap();
        passing.join().unwrap();
        assert_eq!(hub.tracked(), 0, "an entry outlived its subscriptions");
    });
}

/// Two subscribers of one queue come and go while a third party wakes it (holding a clone of
/// its primitive for a moment). While a subscription is held its entry stays (a second
/// subscription gets the same primitive); once none is, no entry is left.
#[test]
fn an_entry_stays_while_held_and_goes_with_its_last_subscription() {
    check(|| {
        let hub = WakeHub::<Kind>::default();
        let subscriber = |hub: WakeHub<Kind>| {
            move || {
                let first = hub.channel("ns", Kind::Workflow, "q");
                let second = hub.channel("ns", Kind::Workflow, "q");
                assert!(std::ptr::eq(&*first, &*second), "the entry was replaced while held");
                drop(first);
                drop(second);
            }
        };
        let a = thread::spawn(subscriber(hub.clone()));
        let waker = thread::spawn({
            let hub = hub.clone();
            move || hub.wake("ns", Kind::Workflow, "q")
        });
        subscriber(hub.clone())();
        a.join().unwrap();
        waker.join().unwrap();
        assert_eq!(hub.tracked(), 0, "an entry outlived its subscriptions");
    });
}

/// A query waiter subscribes to its id, waits for the answer and forgets the id; another
/// waiter's request fails (or its client hangs up) after it subscribed, so it never forgets.
/// The waiter is woken and neither leaves an entry.
#[test]
fn a_query_waiter_is_woken_and_no_waiter_leaves_an_entry() {
    check(|| {
        let answers = KeyedWakeups::default();
        let subscribed = Arc::new(Signal::default());
        let waiter = thread::spawn({
            let (answers, subscribed) = (answers.clone(), subscribed.clone());
            move || {
                let answered = answers.channel("query-1");
                let woken = answered.notified();
                subscribed.give();
                woken.wait();
                answers.forget("query-1");
            }
        });
        let failed = thread::spawn({
            let answers = answers.clone();
            move || drop(answers.channel("query-2"))
        });
        subscribed.wait();
        answers.wake("query-1");
        waiter.join().unwrap();
        failed.join().unwrap();
        assert_eq!(answers.tracked(), 0, "a waiter left its entry behind");
    });
}

// ------------------------------------------------------------------------------------------
// 3: keyed locks

/// Two duplicates of one poll each take the key's lock twice (so its entry is removed and made
/// afresh in between, in some interleavings while the other waits): never two holders at once,
/// and no entry left.
#[test]
fn one_holder_per_key_across_removal_and_recreation() {
    check(|| {
        let locks = KeyedLocks::default();
        let inside = Arc::new(AtomicUsize::new(0));
        let duplicate = |locks: KeyedLocks, inside: Arc<AtomicUsize>| {
            move || {
                for _ in 0..2 {
                    let guard = block_on(locks.lock("poll-1"));
                    assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders of one key at once");
                    inside.fetch_sub(1, SeqCst);
                    drop(guard);
                }
            }
        };
        let other = thread::spawn(duplicate(locks.clone(), inside.clone()));
        duplicate(locks.clone(), inside)();
        other.join().unwrap();
        assert_eq!(locks.tracked(), 0, "an entry outlived its holders");
    });
}

/// A duplicate that gives up waiting (its future polled once, then dropped, as when the client
/// hangs up) while the first holds or releases the lock: no entry is left.
#[test]
fn a_duplicate_that_gives_up_leaves_no_entry() {
    check(|| {
        let locks = KeyedLocks::default();
        let first = thread::spawn({
            let locks = locks.clone();
            move || drop(block_on(locks.lock("poll-1")))
        });
        {
            let mut waiting = pin!(locks.lock("poll-1"));
            let polled = waiting.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(matches!(polled, Poll::Ready(_) | Poll::Pending));
        }
        first.join().unwrap();
        assert_eq!(locks.tracked(), 0, "an entry outlived its holders and waiters");
    });
}

// ------------------------------------------------------------------------------------------
// 4: the writer's hand-off

/// The database as the fake backend keeps it: what is durable, and the faults to inject.
#[derive(Default)]
struct Db {
    durable: Vec<u32>,
    announced: Vec<u32>,
    /// Broken rules seen on the writer thread, checked at the end: a panic there would be
    /// caught as the writer dying (and loom cannot unwind through its own operations).
    broken: Vec<String>,
}

/// Faults the fake backend injects.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// Commits to fail (rolled back), from the first.
    failing_commits: usize,
    /// Savepoint undos to fail (their changes left in the transaction), from the first.
    failing_undos: usize,
    /// The first COMMIT panics (a writer that dies mid-batch).
    panic_on_commit: bool,
}

/// A fake transaction: writes are job ids.
#[derive(Default)]
struct Tx {
    open: bool,
    writes: Vec<u32>,
    savepoint: usize,
}

struct Fake {
    db: Arc<Mutex<Db>>,
    tx: Tx,
    faults: Faults,
}

impl Backend for Fake {
    type Conn = Tx;
    type Announcement = u32;
    type Error = String;

    fn conn(&mut self) -> &mut Tx {
        &mut self.tx
    }

    fn begin(&mut self) -> Result<(), String> {
        if self.tx.open {
            self.db.lock().unwrap().broken.push("a transaction left open".into());
        }
        self.tx = Tx {
            open: true,
            ..Tx::default()
        };
        Ok(())
    }

    fn savepoint(&mut self) -> Result<(), String> {
        if !self.tx.open {
            self.db.lock().unwrap().broken.push("a job run outside a transaction".into());
        }
        self.tx.savepoint = self.tx.writes.len();
        Ok(())
    }

    fn end_job(&mut self, ending: Ending) -> Result<(), String> {
        if ending != Ending::Keep {
            if self.faults.failing_undos > 0 {
                self.faults.failing_undos -= 1;
                return Err("could not roll back to the savepoint".into());
            }
            self.tx.writes.truncate(self.tx.savepoint);
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), String> {
        self.tx.open = false;
        if self.faults.panic_on_commit {
            panic!("the writer dies mid-commit");
        }
        if self.faults.failing_commits > 0 {
            self.faults.failing_commits -= 1;
            return Err("the commit's fsync failed".into());
        }
        self.db.lock().unwrap().durable.append(&mut self.tx.writes);
        Ok(())
    }

    fn rollback(&mut self) {
        self.tx = Tx::default();
    }
}

#[derive(Clone, Copy)]
enum Work {
    Succeeds,
    Fails,
    Panics,
}

/// The writer thread: `group_commit::run` until every sender is gone (or it panics).
fn writer(db: &Arc<Mutex<Db>>, faults: Faults) -> (Sender<Job<Fake>>, thread::JoinHandle<()>) {
    let (jobs, inbox) = group_commit::channel::<Job<Fake>>();
    let db = db.clone();
    let handle = thread::spawn(move || {
        let mut backend = Fake {
            db: db.clone(),
            tx: Tx::default(),
            faults,
        };
        let mut announce = |id| {
            let mut db = db.lock().unwrap();
            if !db.durable.contains(&id) {
                db.broken.push(format!("job {id} announced before (or without) its commit"));
            }
            db.announced.push(id);
        };
        let died = catch_unwind(AssertUnwindSafe(|| group_commit::run(&mut backend, &inbox, &mut announce)));
        assert_eq!(died.is_err(), faults.panic_on_commit);
        // What the unwinding dropped (see the shim's oneshot model); then `inbox` goes, as
        // the real thread's does when it ends or unwinds.
        capstan_sync::shim::oneshot::close_unwound();
    });
    (jobs, handle)
}

/// A caller: writes `id` and announces it, then succeeds, fails or panics; waits for its answer
/// unless `waits` is false (its future dropped). Checks the answer against durability.
fn call(jobs: &Sender<Job<Fake>>, db: &Arc<Mutex<Db>>, id: u32, work: Work, waits: bool) {
    let (job, reply) = group_commit::job::<Fake, u32, String, _>(move |tx: &mut Tx, announced: &mut Vec<u32>| {
        tx.writes.push(id);
        announced.push(id);
        match work {
            Work::Succeeds => Ok(id),
            Work::Fails => Err(format!("job {id} refused")),
            Work::Panics => panic!("job {id} hits a bug"),
        }
    });
    if jobs.send(job).is_err() {
        // The writer is gone: the caller hears so at once.
        assert!(!db.lock().unwrap().durable.contains(&id));
        return;
    }
    if !waits {
        drop(reply);
        return;
    }
    let answer = block_on(reply).map_or_else(|_| Err("the writer dropped the job".to_string()), |a| a.into_result(|e| e));
    let durable = db.lock().unwrap().durable.contains(&id);
    match answer {
        Ok(got) => {
            assert_eq!(got, id);
            assert!(durable, "job {id} acknowledged before (or without) its commit");
        }
        Err(_) => assert!(!durable, "job {id} durable but its caller told it failed"),
    }
}

/// At the end: each write durable at most once, and announced exactly when durable (each job
/// announces its own id).
fn check_end(db: &Arc<Mutex<Db>>) {
    let db = db.lock().unwrap();
    assert!(db.broken.is_empty(), "{:?}", db.broken);
    let mut durable = db.durable.clone();
    durable.sort_unstable();
    let mut announced = db.announced.clone();
    announced.sort_unstable();
    assert!(durable.windows(2).all(|w| w[0] != w[1]), "a write committed twice: {durable:?}");
    assert_eq!(announced, durable, "announcements must be exactly the committed jobs'");
}

/// Two callers side by side, one whose job succeeds and one whose job fails; the first COMMIT
/// fails. Whether the jobs share a batch or not: success exactly when durable, announcements
/// exactly for what committed and only after its commit, nobody left unanswered.
#[test]
fn success_exactly_when_durable_announced_only_after_commit() {
    check(|| {
        let db = Arc::new(Mutex::new(Db::default()));
        let faults = Faults {
            failing_commits: 1,
            ..Faults::default()
        };
        let (jobs, writer) = writer(&db, faults);
        let beside = thread::spawn({
            let (jobs, db) = (jobs.clone(), db.clone());
            move || call(&jobs, &db, 2, Work::Fails, true)
        });
        call(&jobs, &db, 1, Work::Succeeds, true);
        drop(jobs);
        beside.join().unwrap();
        writer.join().unwrap();
        check_end(&db);
    });
}

/// A job that panics beside one whose caller stops waiting (its reply dropped): the panicking
/// job's caller is answered (an error) and its writes and announcement undone; the other's
/// commit goes on and is announced.
#[test]
fn a_panicking_job_and_a_caller_that_stops_waiting() {
    check(|| {
        let db = Arc::new(Mutex::new(Db::default()));
        let (jobs, writer) = writer(&db, Faults::default());
        let beside = thread::spawn({
            let (jobs, db) = (jobs.clone(), db.clone());
            move || call(&jobs, &db, 2, Work::Succeeds, false)
        });
        call(&jobs, &db, 1, Work::Panics, true);
        drop(jobs);
        beside.join().unwrap();
        writer.join().unwrap();
        check_end(&db);
        assert_eq!(db.lock().unwrap().durable, [2]);
    });
}

/// A failed job whose savepoint cannot be undone, batched (in some interleavings) with a
/// successful one: its writes must not be committed behind its caller's back.
#[test]
fn a_job_that_cannot_be_undone_is_not_committed() {
    check(|| {
        let db = Arc::new(Mutex::new(Db::default()));
        let faults = Faults {
            failing_undos: 1,
            ..Faults::default()
        };
        let (jobs, writer) = writer(&db, faults);
        let beside = thread::spawn({
            let (jobs, db) = (jobs.clone(), db.clone());
            move || call(&jobs, &db, 2, Work::Fails, true)
        });
        call(&jobs, &db, 1, Work::Succeeds, true);
        drop(jobs);
        beside.join().unwrap();
        writer.join().unwrap();
        check_end(&db);
    });
}

/// The writer panics in its first COMMIT and its thread ends: every caller is still answered
/// (with an error; queued jobs are dropped with the queue, later sends refused), nothing is
/// announced or durable.
#[test]
fn a_writer_that_dies_mid_batch_leaves_nobody_waiting() {
    check(|| {
        let db = Arc::new(Mutex::new(Db::default()));
        let faults = Faults {
            panic_on_commit: true,
            ..Faults::default()
        };
        let (jobs, writer) = writer(&db, faults);
        let beside = thread::spawn({
            let (jobs, db) = (jobs.clone(), db.clone());
            move || call(&jobs, &db, 2, Work::Succeeds, true)
        });
        call(&jobs, &db, 1, Work::Succeeds, true);
        call(&jobs, &db, 3, Work::Succeeds, true);
        drop(jobs);
        beside.join().unwrap();
        writer.join().unwrap();
        check_end(&db);
        assert!(db.lock().unwrap().durable.is_empty());
    });
}
