//! A small team of spinning threads for decode-sized work.
//!
//! Decoding one token is ~90 primitive calls of a few microseconds each. Rayon parks idle
//! workers, and waking one through the kernel costs tens of microseconds on a VM (measured:
//! the one parallel product a Q8 decode step made cost more than the rest of the step), so
//! those calls ran on one core. This team keeps `threads - 1` helpers spinning for a short
//! while after each job (then parking, so an idle process burns nothing): a job reaches
//! them in well under a microsecond, which makes splitting even a 64 KiB product across
//! both cores worth it. While spinning (helpers waiting for a job, the caller waiting for
//! the helpers) each offers its core to any other runnable thread every few dozen spins:
//! when another program holds one of two vCPUs, the helper and the caller share the other,
//! and a spin that never yields held the core its partner needed (a Q8 decode step then ran
//! at two thirds of the single-thread speed, its spread over five runs 22-43%). A CPU
//! model's decode step runs through [`DecodeSteps`], which keeps it on the calling thread
//! alone while that has lately been faster (hand-offs on a VM get dearer for stretches).
//!
//! [`run`] calls `job(part)` for every part in `0..parts()`, part 0 on the calling thread,
//! and returns when all are done. A helper claims its part before running it; the caller,
//! done with its own, claims and runs any part no helper has started, so a helper the OS
//! has not scheduled costs the speed of one core, never a wait. If the team is busy
//! (another thread's job, or a job calling `run` again) the parts run one after another on
//! the caller: same results, no deadlock. A panic in a part is raised again on the caller.
//!
//! [`run_phased`] runs a job in phases with a barrier between them (every part finishes
//! phase k before any starts phase k + 1): work whose second step reads all of the first's
//! outputs takes one hand-off instead of one a step, and a barrier is cheaper than a
//! hand-off (no claim, and the caller's serial work between two jobs is gone). A part the
//! caller claimed runs its phases on the caller, between the same barriers.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it parks. Consecutive decode calls
/// arrive microseconds apart; a generation that ends leaves the helpers asleep after this.
const SPIN: Duration = Duration::from_micros(300);

/// Spins between two offers of the core to any other runnable thread (a microsecond or two
/// of `pause`; an offer nobody takes is one cheap system call).
const YIELD_EVERY: u32 = 64;

type Job = dyn Fn(usize, usize) + Sync;

struct Shared {
    /// Bumped once per job; helpers run a job when they see a new value.
    epoch: AtomicU64,
    /// The current job. Written by the caller holding the team's lock before the epoch
    /// bump (release), read by helpers after seeing it (acquire); valid until `pending`
    /// reaches zero, which the caller waits for before its borrow ends.
    job: UnsafeCell<*const Job>,
    /// Parts of the current job (after part 0) not finished yet.
    pending: AtomicUsize,
    /// Phases of the current job, written with `job`.
    phases: AtomicUsize,
    /// Parts that have finished the current job's phases so far, summed over its barriers:
    /// phase k + 1 starts once this reaches `parts * (k + 1)`.
    arrived: AtomicUsize,
    /// Per helper part: the last epoch whose part was claimed, by the helper or the caller.
    taken: Vec<AtomicU64>,
    /// Per helper: parked, or about to park.
    sleeping: Vec<AtomicBool>,
    panicked: AtomicBool,
}

// SAFETY: `job` is written only by the thread holding the team's mutex, while no helper
// can read it (every helper finished the previous job: `pending` was zero), and read by
// helpers only after an acquire load of the epoch that the write happened before.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

struct Team {
    shared: Arc<Shared>,
    helpers: Vec<Thread>,
}

static TEAM: OnceLock<Mutex<Team>> = OnceLock::new();
/// Helpers that started, plus the caller; fixed once the team exists.
static PARTS: AtomicUsize = AtomicUsize::new(0);

fn team() -> &'static Mutex<Team> {
    TEAM.get_or_init(|| {
        let n = rayon::current_num_threads().saturating_sub(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(std::ptr::null::<fn(usize, usize)>() as *const Job),
            pending: AtomicUsize::new(0),
            phases: AtomicUsize::new(1),
            arrived: AtomicUsize::new(0),
            taken: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sleeping: (0..n).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
        });
        // Helper i runs part i + 1: the helpers that started must be 0..k, so spawning
        // stops at the first failure (the slots past it are never used).
        let mut helpers = Vec::with_capacity(n);
        for i in 0..n {
            let s = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(format!("rusting_brain-team-{}", i + 1))
                .spawn(move || helper(&s, i))
            {
                Ok(h) => helpers.push(h.thread().clone()),
                Err(_) => break,
            }
        }
        PARTS.store(helpers.len() + 1, Ordering::Release);
        Mutex::new(Team { shared, helpers })
    })
}

fn helper(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(YIELD_EVERY) {
                // Give the core away if anything else wants it: on two vCPUs, a helper that
                // shares one with the caller (another process holds the other) would
                // otherwise spin through its whole time slice while the caller waits for
                // the core, running the step at half the single-thread speed.
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                s.sleeping[index].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen {
                    std::thread::park();
                }
                s.sleeping[index].store(false, Ordering::SeqCst);
                continue;
            }
            std::hint::spin_loop();
        };
        seen = epoch;
        // A stale epoch (the caller finished that job without us) fails the claim: every
        // part of a finished job was taken.
        if s.taken[index].fetch_max(epoch, Ordering::AcqRel) >= epoch {
            continue;
        }
        // SAFETY: see `Shared::job`: the pointer was stored before this epoch was
        // published, and the caller waits for this part (counted in `pending`).
        let job = unsafe { &**s.job.get() };
        let (phases, parts) = (s.phases.load(Ordering::Acquire), PARTS.load(Ordering::Acquire));
        let mut ok = true;
        for k in 0..phases {
            // A part that panicked skips its later phases but still meets the barriers.
            if ok && catch_unwind(AssertUnwindSafe(|| job(index + 1, k))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
                ok = false;
            }
            if k + 1 < phases {
                barrier(s, 1, parts * (k + 1));
            }
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts `count` parts in at the current barrier, then waits until `target` have arrived,
/// offering the core now and then as the other waits do (the part we wait for may need it).
fn barrier(s: &Shared, count: usize, target: usize) {
    s.arrived.fetch_add(count, Ordering::AcqRel);
    let mut spins = 0u32;
    while s.arrived.load(Ordering::Acquire) < target {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(YIELD_EVERY) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

/// How many parts [`run`] splits work into: the helpers plus the caller.
pub fn parts() -> usize {
    team();
    PARTS.load(Ordering::Acquire).max(1)
}

thread_local! {
    /// Set for the length of a decode step [`DecodeSteps`] runs on one thread.
    static SOLO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a model's decode step runs its jobs over the team or every part on the calling
/// thread, chosen by timing its steps both ways (one per model: an f32 model's steps and an
/// int8 one's differ several times over). A hand-off's cost is not fixed on a VM: on two vCPUs
/// the caller's wait for its helper is 0.3-0.4 us most of the time and 1.6-2.3 us for
/// stretches of seconds to minutes (the host running the vCPUs far apart, so every cache
/// line of activations and outputs crosses further), and a 5.3M model's decode then ran at
/// two thirds of one thread's speed. Every step is timed; one in TRY_EVERY runs the other
/// way, and the other way is kept once its mean is a tenth faster. Decided per step, not
/// per product: a step's time is steady where one product's is noise (a per-product
/// choice measured here let noisy stretches send sizes the slow way, and the spread inside
/// a run rose from 1-7% to 11-25%).
pub struct DecodeSteps {
    /// Mean step times, ns (0: not measured yet), split and on one thread.
    split_ns: AtomicU64,
    solo_ns: AtomicU64,
    steps: AtomicU64,
}

/// One decode step in one in this many runs the other way.
const TRY_EVERY: u64 = 64;

/// A step being timed; hand it back to [`DecodeSteps::end`].
pub struct Step {
    solo: bool,
    start: Instant,
}

impl Drop for Step {
    fn drop(&mut self) {
        SOLO.with(|f| f.set(false));
    }
}

impl DecodeSteps {
    /// Nothing measured.
    pub const fn new() -> DecodeSteps {
        DecodeSteps { split_ns: AtomicU64::new(0), solo_ns: AtomicU64::new(0), steps: AtomicU64::new(0) }
    }

    /// Starts a step on this thread: its jobs run on this thread alone when that is the
    /// way chosen for it.
    pub fn begin(&self) -> Step {
        let steps = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        // The tries fall on steps 16, 80, 144, ...: the first soon after a model starts
        // decoding, past its first cold steps.
        let trying = steps % TRY_EVERY == TRY_EVERY / 4;
        let solo = self.solo_best() != trying;
        SOLO.with(|f| f.set(solo));
        Step { solo, start: Instant::now() }
    }

    /// Ends the step begun on this thread and records its time (dropping the step, which
    /// also happens if the step panics, ends its solo run).
    pub fn end(&self, step: Step) {
        let ns = step.start.elapsed().as_nanos().min(1 << 40) as u64;
        self.note(step.solo, ns);
    }

    /// Whether steps on one thread have lately been a tenth faster than split ones.
    fn solo_best(&self) -> bool {
        let (split, solo) = (self.split_ns.load(Ordering::Relaxed), self.solo_ns.load(Ordering::Relaxed));
        split != 0 && solo != 0 && solo.saturating_mul(10) < split.saturating_mul(9)
    }

    /// Adds a step's time to its way's mean: a quarter of the way each (a lasting change
    /// shows within a few steps), a time counting at most twice the mean (one step the OS
    /// preempted must not turn the choice for hundreds of steps).
    fn note(&self, solo: bool, ns: u64) {
        let mean = if solo { &self.solo_ns } else { &self.split_ns };
        let old = mean.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { (old * 3 + ns.min(old.saturating_mul(2))) / 4 };
        mean.store(new, Ordering::Relaxed);
    }
}

impl Default for DecodeSteps {
    fn default() -> Self {
        DecodeSteps::new()
    }
}

/// Runs `job(p)` for every part `p` in `0..parts()`, in parallel where the team is free.
pub fn run(job: &(dyn Fn(usize) + Sync)) {
    run_phased(1, &|p, _| job(p));
}

/// Runs `job(p, k)` for every part `p` in `0..parts()` and phase `k` in `0..phases`, in
/// parallel where the team is free, each phase starting once every part has finished the
/// one before: what phase k of any part wrote, phase k + 1 of every part may read. Where
/// the team is busy, or the step runs on one thread, the phases run in order, each over
/// every part.
pub fn run_phased(phases: usize, job: &(dyn Fn(usize, usize) + Sync)) {
    if phases == 0 {
        return;
    }
    let team = team();
    let in_order = || {
        for k in 0..phases {
            (0..parts()).for_each(|p| job(p, k));
        }
    };
    if SOLO.with(|f| f.get()) {
        in_order();
        return;
    }
    let guard = match team.try_lock() {
        Ok(g) if !g.helpers.is_empty() => g,
        // Busy, poisoned or no helpers: every part here, in order.
        _ => {
            in_order();
            return;
        }
    };
    let s = &guard.shared;
    let parts = guard.helpers.len() + 1;
    s.pending.store(guard.helpers.len(), Ordering::Relaxed);
    s.arrived.store(0, Ordering::Relaxed);
    s.phases.store(phases, Ordering::Relaxed);
    // SAFETY: we hold the lock and `pending` was zero (every earlier job finished before
    // its caller released the lock), so no helper reads `job` now. The lifetime is erased
    // only for the duration of this call: we wait for `pending == 0` below.
    unsafe {
        *s.job.get() = std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), &'static Job>(job) as *const Job;
    }
    let epoch = s.epoch.fetch_add(1, Ordering::SeqCst) + 1;
    for (i, t) in guard.helpers.iter().enumerate() {
        if s.sleeping[i].load(Ordering::SeqCst) {
            t.unpark();
        }
    }
    // The first panic of a part run here; a part that panicked skips its later phases.
    let mut mine = Ok(());
    let mut run_part = |p: usize, k: usize, ok: &mut bool| {
        if *ok {
            if let Err(e) = catch_unwind(AssertUnwindSafe(|| job(p, k))) {
                *ok = false;
                if mine.is_ok() {
                    mine = Err(e);
                }
            }
        }
    };
    let mut own_ok = true;
    run_part(0, 0, &mut own_ok);
    // Parts no helper has started yet: run them here rather than wait for a helper the
    // scheduler may not run for a while. (No list is made unless one is claimed.)
    let mut claimed: Vec<(usize, bool)> = Vec::new();
    for (i, taken) in s.taken.iter().enumerate().take(guard.helpers.len()) {
        if taken.fetch_max(epoch, Ordering::AcqRel) < epoch {
            let mut ok = true;
            run_part(i + 1, 0, &mut ok);
            claimed.push((i + 1, ok));
        }
    }
    for k in 1..phases {
        barrier(s, 1 + claimed.len(), parts * k);
        run_part(0, k, &mut own_ok);
        for (p, ok) in claimed.iter_mut() {
            run_part(*p, k, ok);
        }
    }
    s.pending.fetch_sub(claimed.len(), Ordering::AcqRel);
    // A helper that claimed a part may have lost its core: yield now and then so it can
    // finish on this one.
    let mut spins = 0u32;
    while s.pending.load(Ordering::Acquire) != 0 {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(YIELD_EVERY) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    let theirs = s.panicked.swap(false, Ordering::SeqCst);
    drop(guard);
    if let Err(p) = mine {
        resume_unwind(p);
    }
    if theirs {
        panic!("a rusting_brain team thread panicked while running a kernel");
    }
}

/// Runs `job(p, &mut block p)` for every block, block `p` as part `p` of the team: the
/// way a kernel hands each thread its own slice of an output. `blocks` should hold at
/// most [`parts`] items; any beyond run on the caller after its own. The first four are
/// held on the stack: a decode step hands out ~30 jobs, and two allocations each (the
/// caller's list and this one's) were a visible part of the calling thread's time.
pub fn run_blocks<B: Send>(blocks: impl IntoIterator<Item = B>, job: impl Fn(usize, &mut B) + Sync) {
    const INLINE: usize = 4;
    let parts = parts();
    // Fused: a block after an iterator's first `None` would run as the wrong part.
    let mut blocks = blocks.into_iter().fuse();
    let mut inline: [Mutex<Option<B>>; INLINE] = Default::default();
    let mut count = 0;
    for slot in inline.iter_mut() {
        *slot = Mutex::new(blocks.next());
        count += usize::from(slot.get_mut().is_ok_and(|b| b.is_some()));
    }
    let rest: Vec<Mutex<Option<B>>> = blocks.map(|b| Mutex::new(Some(b))).collect();
    let count = count + rest.len();
    let one = |p: usize| {
        let slot = if p < INLINE { inline.get(p) } else { rest.get(p - INLINE) };
        if let Some(Ok(mut b)) = slot.map(|b| b.lock()) {
            if let Some(b) = b.as_mut() {
                job(p, b);
            }
        }
    };
    run(&one);
    (parts..count).for_each(one);
}

/// Splits `out` into one band per part, each a whole number of `unit` elements, and runs
/// `job(first, band)` with `first` the band's offset in `out`; an output under `min_len`
/// elements runs whole on the caller.
pub fn bands<T: Send>(out: &mut [T], unit: usize, min_len: usize, job: impl Fn(usize, &mut [T]) + Sync) {
    let parts = parts();
    let unit = unit.max(1);
    if parts < 2 || out.len() < min_len.max(2 * unit) {
        job(0, out);
        return;
    }
    let per = out.len().div_ceil(parts).div_ceil(unit) * unit;
    run_blocks(out.chunks_mut(per), |p, b| job(p * per, b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_per_job_and_nested_or_concurrent_calls_fall_back() {
        let parts = parts();
        for round in 0..2000 {
            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            run(&|p| {
                hits[p].fetch_add(1, Ordering::SeqCst);
                if round % 100 == 0 {
                    // A job that calls `run` again gets every part on its own thread.
                    let inner: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                    run(&|q| {
                        inner[q].fetch_add(1, Ordering::SeqCst);
                    });
                    assert!(inner.iter().all(|h| h.load(Ordering::SeqCst) == 1));
                }
            });
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1), "round {round}: {hits:?}");
        }
        // Several threads at once: each job still runs every part exactly once.
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..300 {
                        let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                        run(&|p| {
                            hits[p].fetch_add(1, Ordering::SeqCst);
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
                    }
                });
            }
        });
    }

    /// Every part runs every phase once, and each phase sees what every part wrote in the
    /// one before (the barrier): on the team, nested in a job (the parts in order on one
    /// thread), and from several threads at once (whoever does not get the team runs in
    /// order).
    #[test]
    fn phased_jobs_see_every_part_of_the_previous_phase() {
        let parts = parts();
        // `slow`: the part that takes a while in each phase (none for usize::MAX), so the
        // others reach the barrier first.
        let check = |phases: usize, nested: bool, slow: usize| {
            let slots: Vec<AtomicUsize> = (0..phases * parts).map(|_| AtomicUsize::new(0)).collect();
            run_phased(phases, &|p, k| {
                if p == slow {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(20) {
                        std::hint::spin_loop();
                    }
                }
                if k > 0 {
                    for q in 0..parts {
                        assert_eq!(
                            slots[(k - 1) * parts + q].load(Ordering::Relaxed),
                            1,
                            "part {p}, phase {k}: part {q} had not finished phase {}",
                            k - 1
                        );
                    }
                }
                if nested && p == 0 && k == 0 {
                    let inner: Vec<AtomicUsize> = (0..2 * parts).map(|_| AtomicUsize::new(0)).collect();
                    run_phased(2, &|q, j| {
                        if j == 1 {
                            assert!(inner[..parts].iter().all(|h| h.load(Ordering::SeqCst) == 1));
                        }
                        inner[j * parts + q].fetch_add(1, Ordering::SeqCst);
                    });
                    assert!(inner.iter().all(|h| h.load(Ordering::SeqCst) == 1));
                }
                // Relaxed on purpose: the barrier must order it for the next phase.
                slots[k * parts + p].fetch_add(1, Ordering::Relaxed);
            });
            assert!(slots.iter().all(|h| h.load(Ordering::SeqCst) == 1), "{phases} phases: {slots:?}");
        };
        for round in 0..3000 {
            let slow = [usize::MAX, 0, parts - 1][round % 3];
            check(1 + round % 4, round % 100 == 0, slow);
        }
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for round in 0..300 {
                        check(2 + round % 3, false, round % parts);
                    }
                });
            }
        });
    }

    /// A part that panics in a phase panics the caller (on the team, once every part has
    /// gone through the barriers; in order, at once), nothing waits forever, and the team
    /// takes the next job.
    #[test]
    fn a_phased_job_whose_part_panics_does_not_hang() {
        let parts = parts();
        for failing in 0..parts {
            for phase in 0..3 {
                let r = std::panic::catch_unwind(|| {
                    run_phased(3, &|p, k| {
                        if p == failing && k == phase {
                            panic!("part {p} fails in phase {k}");
                        }
                    })
                });
                assert!(r.is_err(), "part {failing}'s panic in phase {phase} reaches the caller");
            }
        }
        let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        run_phased(2, &|p, _| {
            hits[p].fetch_add(1, Ordering::SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 2));
    }

    /// Every block reaches the job once, as its own index, whether the blocks fit the
    /// stack-held four, spill past them, or are fewer than the parts.
    #[test]
    fn run_blocks_hands_each_block_to_its_part_once() {
        for count in [0usize, 1, 2, 3, 4, 5, 9] {
            let mut out = vec![usize::MAX; count];
            run_blocks(out.iter_mut().enumerate(), |p, (i, slot)| {
                assert_eq!(p, *i, "block {i} ran as part {p}");
                assert_eq!(**slot, usize::MAX, "block {i} ran twice");
                **slot = p;
            });
            assert_eq!(out, (0..count).collect::<Vec<_>>(), "{count} blocks");
        }
    }

    /// Steps split until one-thread steps are timed a tenth faster, then run on one
    /// thread except one in TRY_EVERY; a solo step runs every part on the calling thread;
    /// one preempted step moves a mean by at most a quarter of it.
    #[test]
    fn decode_steps_follow_the_faster_way() {
        let d = DecodeSteps::new();
        let ways = |d: &DecodeSteps, n: u64| -> Vec<bool> {
            (0..n)
                .map(|_| {
                    // Dropped, not ended: the timings are set below.
                    d.begin().solo
                })
                .collect()
        };
        let first = ways(&d, 2 * TRY_EVERY);
        assert_eq!(first.iter().filter(|&&s| s).count(), 2, "only the tries alone while nothing is timed");
        d.split_ns.store(1000, Ordering::Relaxed);
        d.solo_ns.store(920, Ordering::Relaxed);
        assert_eq!(ways(&d, 2 * TRY_EVERY).iter().filter(|&&s| s).count(), 2, "8% faster is not enough");
        d.solo_ns.store(880, Ordering::Relaxed);
        assert_eq!(
            ways(&d, 2 * TRY_EVERY).iter().filter(|&&s| !s).count(),
            2,
            "12% faster: alone but for the tries"
        );
        d.note(false, 1_000_000);
        assert_eq!(d.split_ns.load(Ordering::Relaxed), 1250, "an outlier counts as twice the mean");
        d.note(true, 0);
        assert_eq!(d.solo_ns.load(Ordering::Relaxed), 660);
        // A solo step's jobs run on the calling thread, parts in order.
        let step = loop {
            let s = d.begin();
            if s.solo {
                break s;
            }
        };
        let me = std::thread::current().id();
        let seen = Mutex::new(Vec::new());
        run(&|p| {
            if p == 0 {
                // Time for a helper to wake and claim the other parts, were it asked.
                std::thread::sleep(Duration::from_millis(20));
            }
            seen.lock().unwrap().push((p, std::thread::current().id() == me))
        });
        d.end(step);
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen, (0..parts()).map(|p| (p, true)).collect::<Vec<_>>());
        assert!(!SOLO.with(|f| f.get()), "the step's end clears the flag");
        let step = loop {
            let s = d.begin();
            if s.solo {
                break s;
            }
        };
        assert!(SOLO.with(|f| f.get()));
        drop(step);
        assert!(!SOLO.with(|f| f.get()), "so does dropping it (a step that panicked)");
    }

    #[test]
    fn a_panicking_part_panics_the_caller_and_the_team_keeps_working() {
        let parts = parts();
        let r = std::panic::catch_unwind(|| {
            run(&|p| {
                if p == parts - 1 {
                    panic!("part {p} fails");
                }
            })
        });
        assert!(r.is_err());
        let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        run(&|p| {
            hits[p].fetch_add(1, Ordering::SeqCst);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1));
    }
}
