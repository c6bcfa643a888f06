//! The work queue, with client-go `workqueue` semantics: a key is queued at most once
//! (dirty set), never handed to two workers at once (processing set), and a key added
//! while it is processed runs once more after `done`. Delayed adds, and on failure the
//! larger of a per-key exponential backoff (reset by `forget`) and an overall token
//! bucket (`add_rate_limited`, like client-go's default controller rate limiter).
//!
//! Lanes: keys added with [`Queue::add_prompt`] (new work: a GpuJob never looked at) or
//! [`Queue::add_under_way`] (an attempt that just finished, a pod newly waiting at the
//! gate or newly unschedulable) are handed out before
//! the normal lane (resyncs, retries, echoes of the operator's own writes), so new work
//! does not wait behind a backlog of looks that change nothing. The normal lane is first in, first out. The prompt lane
//! takes turns between tenants ([`Queue::fair_by`]: for GpuJobs, their namespace), first
//! in, first out within each: a burst of ten thousand new GpuJobs in some namespaces does
//! not make one created meanwhile in another wait behind all of them. Within a tenant's
//! turn, work under way ([`Queue::add_under_way`]: a pod at the gate, an attempt that
//! finished) goes before work not begun (a GpuJob never looked at): under a burst, a
//! GpuJob whose Job is made has its pod let go before the next GpuJob's Job is made,
//! rather than every pod waiting at the gate until the burst's Jobs are all made.
//!
//! A third lane holds the first look at the GpuJobs of a shard this replica just gained
//! ([`Queue::add_first_look`]; those never observed are new work, in the prompt lane):
//! they are handed out ahead of the normal lane, and share the workers' time with the
//! prompt lane while both have keys: the next key comes from the lane whose keys have
//! held workers for less time since either lane last went from empty to having keys
//! (their turns alternate on a tie). So a takeover is not queued behind the survivor's
//! own backlog, the survivor's new work keeps about half the workers' time or more (the
//! first looks take less when they are quick), and a first look with nothing to write
//! does not wait a turn behind new work whose writes wait on the API budget. A key added
//! to either lane while it is processed runs again in that lane (the prompt lane when
//! both asked), unless the look it was in flight for was its first look
//! ([`Queue::first_look_over`]): the first-look lane is for first looks, so the
//! follow-ups of looks made (a pod at the gate, an echo) do not take its share.
//!
//! Time is tokio's, so the behaviour is tested on a paused clock.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::QueueMetrics;
use crate::ratelimit::TokenBucket;
use fair::FairLane;
use fifo::Fifo;

mod fair;
mod fifo;

/// Retry limits: per-key exponential backoff `base * 2^(failures-1)` capped at `max`,
/// and an overall bucket of `qps`/`burst` retries.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    pub qps: f64,
    pub burst: u32,
}

impl Default for Backoff {
    fn default() -> Backoff {
        // client-go's default controller rate limiter: 5 ms doubling to 1000 s per
        // item, 10 qps with a burst of 100 overall.
        Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

impl Backoff {
    pub fn delay(&self, failures: u32) -> Duration {
        crate::backoff::exponential(self.base, self.max, failures)
    }

    /// The same, with no wait longer than `most`.
    pub fn at_most(self, most: Duration) -> Backoff {
        Backoff {
            max: self.max.min(most),
            ..self
        }
    }
}

#[derive(Debug)]
struct State<K> {
    /// The prompt lane, handed out first (sharing the workers' time with `first_look`).
    prompt: FairLane<K>,
    /// The first looks at a gained shard's GpuJobs, first in, first out.
    first_look: VecDeque<K>,
    /// Whether the last key handed out on a tie of the two lanes was a first look.
    first_look_last: bool,
    /// The time keys of the prompt and the first-look lanes held workers (finished keys;
    /// those in flight are counted at each hand-out) since `sharing_since`.
    served: Served,
    /// When one of those two lanes last went from empty to having keys: time served
    /// before, while the other may have had none, is no credit.
    sharing_since: Instant,
    /// Keys added to the prompt or the first-look lane while processed: the lane they run
    /// again in after `done` (the prompt lane if new work asked; the first-look lane if
    /// only a first look did and the look in flight was not it; otherwise the normal
    /// lane).
    again_in: HashMap<K, Lane>,
    /// The normal lane; a key queued there can move ahead (`add_locked`).
    ready: Fifo<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    /// Delayed adds: (due, seq, key), earliest first; `due_of` keeps each key's earliest.
    waiting: BTreeSet<(Instant, u64, K)>,
    due_of: HashMap<K, (Instant, u64)>,
    seq: u64,
    failures: HashMap<K, u32>,
    /// When each dirty key was queued (for the time-in-queue metric).
    queued_at: HashMap<K, Instant>,
    /// When each key's processing started (work duration, unfinished work, the lanes'
    /// shares), and the lane it was taken from.
    started_at: HashMap<K, (Instant, Lane)>,
    shutting_down: bool,
}

/// A cloneable handle to one queue.
#[derive(Debug)]
pub struct Queue<K> {
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
    backoff: Backoff,
    bucket: Arc<TokenBucket>,
    metrics: Option<QueueMetrics>,
    /// Whose turn a key of the prompt lane waits for.
    tenant: fn(&K) -> &str,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Queue {
            state: self.state.clone(),
            notify: self.notify.clone(),
            backoff: self.backoff,
            bucket: self.bucket.clone(),
            metrics: self.metrics.clone(),
            tenant: self.tenant,
        }
    }
}

/// Every key in one tenant: the prompt lane is first in, first out.
fn one_tenant<K>(_: &K) -> &str {
    ""
}

impl<K: Clone + Eq + Hash + Ord> Queue<K> {
    pub fn new(backoff: Backoff) -> Queue<K> {
        Self::with_metrics(backoff, None)
    }

    pub fn with_metrics(backoff: Backoff, metrics: Option<QueueMetrics>) -> Queue<K> {
        Queue {
            bucket: Arc::new(TokenBucket::new(backoff.qps, backoff.burst)),
            metrics,
            state: Arc::new(Mutex::new(State {
                prompt: FairLane::new(),
                first_look: VecDeque::new(),
                first_look_last: false,
                served: Served::default(),
                sharing_since: Instant::now(),
                again_in: HashMap::new(),
                ready: Fifo::default(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                waiting: BTreeSet::new(),
                due_of: HashMap::new(),
                seq: 0,
                failures: HashMap::new(),
                queued_at: HashMap::new(),
                started_at: HashMap::new(),
                shutting_down: false,
            })),
            notify: Arc::new(Notify::new()),
            backoff,
            tenant: one_tenant,
        }
    }

    /// The prompt lane takes turns between the tenants `tenant` names.
    pub fn fair_by(mut self, tenant: fn(&K) -> &str) -> Queue<K> {
        self.tenant = tenant;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // A panic while holding the lock leaves consistent data (every method finishes
        // its updates before it can panic), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` now, unless it is queued already.
    pub fn add(&self, key: K) {
        self.add_in(key, Lane::Normal);
    }

    /// Queues `key` now in the prompt lane, ahead of the normal lane and sharing the
    /// workers' time with the first-look lane. A key queued in the normal lane moves
    /// here (an echo of its own writes must not hold back its pod at the gate behind
    /// the backlog); one queued in another lane keeps its place. A key added while it is
    /// processed runs again in this lane.
    pub fn add_prompt(&self, key: K) {
        self.add_in(key, Lane::Prompt);
    }

    /// As [`Queue::add_prompt`], for the next step of work under way (a pod at the gate,
    /// an attempt that finished): ahead of the work not begun in its tenant's turn.
    pub fn add_under_way(&self, key: K) {
        self.add_in(key, Lane::UnderWay);
    }

    /// Queues `key` now for a first look after its shard was gained: ahead of the
    /// normal lane, sharing the workers' time with the prompt lane. A key queued in the
    /// normal lane moves here; one queued in another lane keeps its place; one added
    /// while it is processed runs again in this lane, unless
    /// [`Queue::first_look_over`] says that look was its first.
    pub fn add_first_look(&self, key: K) {
        self.add_in(key, Lane::FirstLook);
    }

    /// `key` has had its first look through to an outcome: a first-look add made while
    /// it was processed no longer runs it again in the first-look lane (it
    /// runs again in the normal lane, or the prompt lane if new work asked). Otherwise
    /// every echo of the look's own writes, and its pod then waiting at the gate, would
    /// come back ahead of the backlog as another "first" look, taking that lane's share
    /// of the workers from new work.
    pub fn first_look_over(&self, key: &K) {
        let mut s = self.lock();
        if s.again_in.get(key) == Some(&Lane::FirstLook) {
            s.again_in.remove(key);
        }
    }

    fn add_in(&self, key: K, lane: Lane) {
        let mut s = self.lock();
        let woke = add_locked(&mut s, key, lane, self.tenant, self.metrics.as_ref());
        drop(s);
        if woke {
            self.notify.notify_one();
        }
    }

    /// Queues `key` now unless a retry after failures is already scheduled for it. For
    /// periodic resyncs, which must not cut backoffs short. A key that failed but has no
    /// retry waiting (its reconcile was cancelled, or ended without scheduling one) is
    /// queued: nothing else would bring it back.
    pub fn add_unless_backing_off(&self, key: K) {
        let scheduled = {
            let s = self.lock();
            s.failures.get(&key).is_some_and(|n| *n > 0) && s.due_of.contains_key(&key)
        };
        if !scheduled {
            self.add(key);
        }
    }

    /// Queues `key` after `delay` (at once when zero). A key waiting for an earlier time
    /// keeps it.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let due = Instant::now() + delay;
        let mut s = self.lock();
        if s.shutting_down {
            return;
        }
        if let Some(&(old_due, old_seq)) = s.due_of.get(&key) {
            if old_due <= due {
                return;
            }
            s.waiting.remove(&(old_due, old_seq, key.clone()));
        }
        s.seq += 1;
        let seq = s.seq;
        s.waiting.insert((due, seq, key.clone()));
        s.due_of.insert(key, (due, seq));
        drop(s);
        // Wake a worker so it re-arms its timer for the new earliest deadline.
        self.notify.notify_one();
    }

    /// Queues `key` after the larger of its backoff (one more failure for this key)
    /// and its turn in the overall retry bucket.
    pub fn add_rate_limited(&self, key: K) -> Duration {
        let per_key = {
            let mut s = self.lock();
            let n = s.failures.entry(key.clone()).or_insert(0);
            *n += 1;
            self.backoff.delay(*n)
        };
        let delay = per_key.max(self.bucket.reserve());
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
        self.add_after(key, delay);
        delay
    }

    /// Clears the failure count of `key` (after a success).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Drops the keys `gone` names (those of shards lost: another replica has them now),
    /// with their delayed adds and failure counts: a replica left holding nothing hands
    /// out no key, so they would stay, counted in its depth, and a later term of the
    /// shard would start from them. A key with a worker finishes, and is not queued
    /// again.
    pub fn drop_where(&self, gone: impl Fn(&K) -> bool) {
        let mut guard = self.lock();
        let s = &mut *guard;
        let keep = |k: &K| !gone(k);
        s.prompt.retain(keep);
        s.first_look.retain(|k| keep(k));
        s.ready.retain(keep);
        // One with a worker is not queued again when done.
        s.dirty.retain(|k| keep(k));
        s.queued_at.retain(|k, _| keep(k));
        s.again_in.retain(|k, _| keep(k));
        s.waiting.retain(|(_, _, k)| keep(k));
        s.due_of.retain(|k, _| keep(k));
        s.failures.retain(|k, _| keep(k));
        if let Some(m) = &self.metrics {
            m.depth.set(gauge(s.len()));
        }
    }

    /// Failures counted for `key` since its last `forget`.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Is `key` with a worker now?
    pub fn in_flight(&self, key: &K) -> bool {
        self.lock().processing.contains(key)
    }

    /// Keys ready to be processed now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next key to process, waiting for one; `None` once shut down and drained.
    /// Every key returned must be passed to [`Queue::done`].
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next_due = {
                let mut s = self.lock();
                let now = Instant::now();
                promote_due(&mut s, now, self.tenant, self.metrics.as_ref());
                if let Some((key, lane)) = s.pop(now) {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    s.started_at.insert(key.clone(), (now, lane));
                    if let Some(m) = &self.metrics {
                        if let Some(at) = s.queued_at.remove(&key) {
                            m.queue_duration
                                .observe(now.saturating_duration_since(at).as_secs_f64());
                        }
                        m.depth.set(gauge(s.len()));
                    }
                    let more = s.len() > 0;
                    drop(s);
                    if more {
                        // Pass the baton: another worker may take the next key.
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                if s.shutting_down {
                    drop(s);
                    self.notify.notify_one();
                    return None;
                }
                s.waiting.first().map(|(due, _, _)| *due)
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks `key` processed; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if let Some((started, lane)) = s.started_at.remove(key) {
            let now = Instant::now();
            let shared = s.shared_since(started, now);
            s.served.charge(lane, shared);
            let took = now.saturating_duration_since(started);
            if let Some(m) = &self.metrics {
                m.work_duration.observe(took.as_secs_f64());
            }
        }
        let again = s.again_in.remove(key).unwrap_or(Lane::Normal);
        if s.dirty.contains(key) && !s.shutting_down {
            push_locked(&mut s, key.clone(), again, self.tenant);
            if let Some(m) = &self.metrics {
                m.depth.set(gauge(s.len()));
            }
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Updates the gauges that depend on the time of asking (unfinished work, longest
    /// running processor), as client-go does on its metrics tick. Call before a scrape.
    pub fn update_gauges(&self) {
        let Some(m) = &self.metrics else {
            return;
        };
        let s = self.lock();
        let now = Instant::now();
        let running: Vec<f64> = s
            .started_at
            .values()
            .map(|(t, _)| now.saturating_duration_since(*t).as_secs_f64())
            .collect();
        m.unfinished_work.set(running.iter().sum());
        m.longest_running
            .set(running.iter().copied().fold(0.0, f64::max));
        m.depth.set(gauge(s.len()));
    }

    /// Stops handing out keys; `get` returns `None` to every worker, delayed keys are
    /// dropped. Keys already handed out finish normally.
    pub fn shut_down(&self) {
        let mut s = self.lock();
        s.shutting_down = true;
        s.prompt.clear();
        s.first_look.clear();
        s.again_in.clear();
        s.ready.clear();
        s.dirty.clear();
        s.waiting.clear();
        s.due_of.clear();
        s.queued_at.clear();
        drop(s);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// The prompt lane, work not begun.
    Prompt,
    /// The prompt lane, work under way: ahead of `Prompt` in its tenant's turn.
    UnderWay,
    FirstLook,
    Normal,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn len(&self) -> usize {
        self.prompt.len + self.first_look.len() + self.ready.len()
    }

    /// The next key, and its lane: while the prompt and first-look lanes both have
    /// keys, the one that held workers for less time (in turns on a tie); then whichever
    /// has; then the normal lane.
    fn pop(&mut self, now: Instant) -> Option<(K, Lane)> {
        let first_look = match (self.first_look.is_empty(), self.prompt.len == 0) {
            (true, _) => false,
            (false, true) => true,
            (false, false) => {
                let (prompt, first_look) = self.served_by(now);
                match first_look.cmp(&prompt) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Equal => {
                        self.first_look_last = !self.first_look_last;
                        self.first_look_last
                    }
                }
            }
        };
        if first_look {
            return self.first_look.pop_front().map(|k| (k, Lane::FirstLook));
        }
        if let Some(k) = self.prompt.pop() {
            // Under way or not, its time counts to the prompt lane's share.
            return Some((k, Lane::Prompt));
        }
        self.ready.pop().map(|k| (k, Lane::Normal))
    }

    /// The time the prompt and first-look lanes' keys held workers, those in flight up to
    /// `now` included.
    fn served_by(&self, now: Instant) -> (Duration, Duration) {
        let mut served = self.served;
        for (started, lane) in self.started_at.values() {
            served.charge(*lane, self.shared_since(*started, now));
        }
        (served.prompt, served.first_look)
    }

    /// The part of a key's time on a worker, from `started` to `now`, that counts to its
    /// lane's share: none before the lanes last started sharing.
    fn shared_since(&self, started: Instant, now: Instant) -> Duration {
        now.saturating_duration_since(started.max(self.sharing_since))
    }
}

/// The time the keys of the two lanes that share the workers held them.
#[derive(Debug, Default, Clone, Copy)]
struct Served {
    prompt: Duration,
    first_look: Duration,
}

impl Served {
    fn charge(&mut self, lane: Lane, took: Duration) {
        match lane {
            Lane::Prompt | Lane::UnderWay => self.prompt += took,
            Lane::FirstLook => self.first_look += took,
            Lane::Normal => {}
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Returns true when the key became ready (a worker should wake).
fn add_locked<K: Clone + Eq + Hash + Ord>(
    s: &mut State<K>,
    key: K,
    lane: Lane,
    tenant: fn(&K) -> &str,
    metrics: Option<&QueueMetrics>,
) -> bool {
    if s.shutting_down {
        return false;
    }
    if s.processing.contains(&key) && lane != Lane::Normal {
        // It runs again after `done` (once marked dirty), in this lane; the prompt lane
        // over the first look's, which `first_look_over` may withdraw, and work under way
        // over work not begun.
        let again = s.again_in.entry(key.clone()).or_insert(lane);
        if lane == Lane::UnderWay || (lane == Lane::Prompt && *again == Lane::FirstLook) {
            *again = lane;
        }
    }
    if s.dirty.contains(&key) {
        // Queued already. Asked for ahead of where it waits, it moves (not counted as
        // an add: it was queued already): out of the normal lane to the lane asked for,
        // or, as work under way, ahead of its tenant's work not begun.
        if !s.processing.contains(&key) {
            if lane != Lane::Normal && s.ready.take(&key) {
                push_locked(s, key, lane, tenant);
            } else if lane == Lane::UnderWay {
                s.prompt.move_under_way(&key, tenant);
            }
        }
        return false;
    }
    // Counted as client-go counts: an add that queues the key (or marks it to run again
    // after processing), not a duplicate of a key already waiting.
    if let Some(m) = metrics {
        m.adds.inc();
    }
    s.dirty.insert(key.clone());
    s.queued_at.insert(key.clone(), Instant::now());
    if s.processing.contains(&key) {
        // Runs again after `done`.
        return false;
    }
    push_locked(s, key, lane, tenant);
    if let Some(m) = metrics {
        m.depth.set(gauge(s.len()));
    }
    true
}

/// Puts `key` at the end of `lane`.
fn push_locked<K: Clone + Eq + Hash + Ord>(
    s: &mut State<K>,
    key: K,
    lane: Lane,
    tenant: fn(&K) -> &str,
) {
    let was_empty = match lane {
        Lane::Prompt | Lane::UnderWay => s.prompt.len == 0,
        Lane::FirstLook => s.first_look.is_empty(),
        Lane::Normal => false,
    };
    if was_empty {
        // The two lanes share the workers afresh.
        s.served = Served::default();
        s.sharing_since = Instant::now();
    }
    match lane {
        Lane::Prompt => s.prompt.push(key, tenant, false),
        Lane::UnderWay => s.prompt.push(key, tenant, true),
        Lane::FirstLook => s.first_look.push_back(key),
        Lane::Normal => s.ready.push(key),
    }
}

fn promote_due<K: Clone + Eq + Hash + Ord>(
    s: &mut State<K>,
    now: Instant,
    tenant: fn(&K) -> &str,
    metrics: Option<&QueueMetrics>,
) {
    while let Some((due, _, _)) = s.waiting.first() {
        if *due > now {
            break;
        }
        let Some((_, _, key)) = s.waiting.pop_first() else {
            break;
        };
        s.due_of.remove(&key);
        add_locked(s, key, Lane::Normal, tenant, metrics);
    }
}

#[cfg(test)]
mod tests;
