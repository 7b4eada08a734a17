//! The decoding thread: continuous batching over one model.
//!
//! Requests wait in a bounded queue. Between steps the thread takes new ones (up to
//! `max_batch` active), prefills them (an int8 model all in one pass, a prompt that starts
//! as a recent one did from a copy of its cache) into KV caches of their own and sends each
//! its first token, then decodes every
//! active request in one `forward_cached_rows_with` step: the weight products once over all
//! the rows, each request's adapters (if it named some) on its own row, attention per
//! request over its own cache. A request leaves at the step after it
//! finishes or its client goes away, and its cache goes with it. Each row's sums do not
//! depend on the other rows, so a seeded request gives the same tokens under any load.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub use crate::queue::Busy;
use crate::queue::{self, Inbox, Queue};

use rusting_brain::{KvCaches, Sampler, TransformerLm};
use tokio::sync::mpsc::UnboundedSender;

/// Why a reply ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence id or a stop string.
    Stop,
    /// `max_tokens`, or the model's context is full.
    Length,
}

impl Finish {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What the decoding thread tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// New text of the reply (possibly empty while a character's bytes are incomplete).
    Text(String),
    /// The reply ended: why, and how many tokens it drew.
    Done { finish: Finish, completion_tokens: usize },
    /// The model refused the request or failed; nothing more comes.
    Failed(String),
}

/// One request for the decoding thread.
pub struct Job {
    /// The prompt's token ids (already checked against the vocabulary and the context).
    pub prompt: Vec<u32>,
    /// The adapters loaded beside the model under this name, or the base.
    pub adapter: Option<String>,
    /// The most tokens to draw.
    pub max_tokens: usize,
    /// How each token is drawn.
    pub sampler: Sampler,
    /// Strings that end the reply where they appear (the reply is cut before them).
    pub stops: Vec<String>,
    /// Where the reply goes; a closed channel means the client left.
    pub events: UnboundedSender<Event>,
}

/// What the decoding thread has done, for `/health`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Requests being decoded.
    pub active: AtomicUsize,
    /// Batched decode steps run.
    pub steps: AtomicU64,
    /// Rows those steps decoded (one a request a step).
    pub rows: AtomicU64,
    /// Steps whose requests named different adapters (or an adapter and the base).
    pub mixed_steps: AtomicU64,
    /// Prompt positions whose keys and values came from an earlier request's cache.
    pub reused_positions: AtomicU64,
}

/// The handlers' side of the decoding thread.
#[derive(Clone)]
pub struct Engine {
    jobs: Queue<Job>,
    stats: Arc<Stats>,
}

impl Engine {
    /// Starts the decoding thread over `model`. `end_ids` end a reply; `tokenizer` turns
    /// drawn ids into text.
    pub fn start(
        model: TransformerLm, tokenizer: tokenizers::Tokenizer, end_ids: Vec<u32>, max_batch: usize,
        max_queue: usize,
    ) -> Engine {
        let (jobs, inbox) = queue::bounded(max_queue);
        let stats = Arc::new(Stats::default());
        let counts = stats.clone();
        std::thread::Builder::new()
            .name("decoder".into())
            .spawn(move || {
                Decoder {
                    model,
                    tokenizer,
                    end_ids,
                    max_batch: max_batch.max(1),
                    active: Vec::new(),
                    stats: counts,
                    pool: Vec::new(),
                }
                .run(inbox)
            })
            .expect("starting the decoding thread");
        Engine { jobs, stats }
    }

    /// Requests waiting to be taken.
    pub fn queued(&self) -> usize {
        self.jobs.waiting()
    }

    /// What the decoding thread has done.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Queues `job`, or refuses it when `max_queue` requests already wait.
    pub fn submit(&self, job: Job) -> Result<(), Busy> {
        self.jobs.submit(job)
    }
}

/// A request being decoded.
struct Slot {
    job: Job,
    caches: KvCaches,
    /// The prompt and every drawn id (the sampler's repetition context).
    context: Vec<u32>,
    drawn: Vec<u32>,
    /// The text sent so far.
    sent: usize,
}

struct Decoder {
    model: TransformerLm,
    tokenizer: tokenizers::Tokenizer,
    end_ids: Vec<u32>,
    max_batch: usize,
    active: Vec<Slot>,
    stats: Arc<Stats>,
    /// The caches of the last requests to finish (int8 models): the ids each holds and the
    /// adapters it was computed with, newest last.
    pool: Vec<(Vec<u32>, Option<String>, KvCaches)>,
}

/// Finished requests' caches kept for the prompts that start as theirs did.
const POOL: usize = 4;
/// Shared prompt positions below which an earlier cache is not worth copying.
const MIN_REUSE: usize = 8;

/// The most prompt positions one joint prefill takes: the pass's activations stay a few
/// megabytes a layer.
const PREFILL_ROWS: usize = 2048;

impl Decoder {
    fn run(mut self, inbox: Inbox<Job>) {
        loop {
            // Idle: wait for work. Busy: take what has arrived, without waiting.
            let mut joining = Vec::new();
            if self.active.is_empty() {
                match inbox.recv() {
                    Some(job) => joining.push(job),
                    None => return,
                }
            }
            while self.active.len() + joining.len() < self.max_batch {
                match inbox.try_recv() {
                    Some(job) => joining.push(job),
                    None => break,
                }
            }
            if self.model.is_quantized() && !joining.is_empty() && !self.active.is_empty() {
                // int8: the joining prompts ride in the decode step's pass.
                self.step_joined(joining);
            } else {
                self.admit(joining);
                self.stats.active.store(self.active.len(), Ordering::Relaxed);
                if !self.active.is_empty() {
                    self.step();
                }
            }
        }
    }

    /// Prefills the joining requests, each into its own KV cache, and draws each one's
    /// first token at once (its time to first token is its prefill). An int8 model
    /// prefills them together through `forward_cached_many`, a prompt that starts as a
    /// recent one did continuing from a copy of that request's cache: each position's sums
    /// are the same however prompts are grouped or split, so a request gets the bits it
    /// gets alone. An f32 model, whose long products sum in blocks of the batch's size,
    /// prefills each alone so its replies stay the same under any load.
    fn admit(&mut self, jobs: Vec<Job>) {
        if !self.model.is_quantized() {
            for job in jobs {
                let caches = self.model.new_kv_caches();
                self.prefill(vec![(job, caches)]);
            }
            return;
        }
        let (mut group, mut rows) = (Vec::new(), 0);
        for job in jobs {
            let Some((job, caches)) = self.ready(job) else { continue };
            let new = job.prompt.len() - caches.len();
            if rows + new > PREFILL_ROWS && !group.is_empty() {
                self.prefill(std::mem::take(&mut group));
                rows = 0;
            }
            rows += new;
            group.push((job, caches));
        }
        if !group.is_empty() {
            self.prefill(group);
        }
    }

    /// An int8 model's joining request with its cache: a copy of a recent request's cache
    /// where the prompt starts as that one did, then the prompt's leading pieces where it is
    /// over the piece limit (a pass each), so what is left fits one pass. `None` when the
    /// model refused it (the request has heard why).
    fn ready(&mut self, job: Job) -> Option<(Job, KvCaches)> {
        let limit = self.model.piece_limit();
        let mut caches = self.model.new_kv_caches();
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, (_, adapter, _))| *adapter == job.adapter)
            .map(|(i, (ids, _, _))| (i, ids.iter().zip(&job.prompt).take_while(|(a, b)| a == b).count()))
            .max_by_key(|&(_, n)| n);
        if let Some((i, n)) = best {
            let n = n.min(job.prompt.len() - 1);
            if n >= MIN_REUSE && self.model.copy_kv_prefix(&self.pool[i].2, &mut caches, n).is_ok() {
                self.stats.reused_positions.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        while job.prompt.len() - caches.len() > limit {
            let at = caches.len();
            let piece = &job.prompt[at..at + limit];
            if let Err(e) =
                self.model.forward_cached_many(&[piece], &mut [&mut caches], &[job.adapter.as_deref()])
            {
                let _ = job.events.send(Event::Failed(e.to_string()));
                return None;
            }
        }
        Some((job, caches))
    }

    /// An int8 decode step with the joining requests' prompts in the same pass: the active
    /// requests' last ids and every joining prompt (after what its cache holds) through one
    /// `forward_cached_many`, so the weights are read once for both; then each active
    /// request's next token and each joining one's first. Each position's sums are what
    /// its own pass gives, so nothing changes a request's tokens. Where the joint pass is
    /// refused (nothing changed), or the prompts are too many rows for one pass, the
    /// joining requests prefill first and the step runs alone.
    fn step_joined(&mut self, jobs: Vec<Job>) {
        self.active.retain(|s| !s.job.events.is_closed());
        let joining: Vec<(Job, KvCaches)> = jobs.into_iter().filter_map(|j| self.ready(j)).collect();
        let rows: usize = joining.iter().map(|(j, c)| j.prompt.len() - c.len()).sum();
        if joining.is_empty() || self.active.is_empty() || rows > PREFILL_ROWS {
            if !joining.is_empty() {
                self.prefill(joining);
            }
            self.stats.active.store(self.active.len(), Ordering::Relaxed);
            if !self.active.is_empty() {
                self.step();
            }
            return;
        }
        let (jobs, mut caches): (Vec<Job>, Vec<KvCaches>) = joining.into_iter().unzip();
        let n = self.active.len();
        let last: Vec<u32> = self.active.iter().map(|s| *s.context.last().expect("a drawn id")).collect();
        let result = {
            let mut pieces: Vec<&[u32]> = last.chunks(1).collect();
            pieces.extend(jobs.iter().zip(&caches).map(|(j, c)| &j.prompt[c.len()..]));
            let mut adapters: Vec<Option<&str>> = Vec::with_capacity(pieces.len());
            let mut refs: Vec<&mut KvCaches> = Vec::with_capacity(pieces.len());
            for s in self.active.iter_mut() {
                adapters.push(s.job.adapter.as_deref());
                refs.push(&mut s.caches);
            }
            adapters.extend(jobs.iter().map(|j| j.adapter.as_deref()));
            refs.extend(caches.iter_mut());
            let mixed = adapters.iter().any(|a| *a != adapters[0]);
            self.model.forward_cached_many(&pieces, &mut refs, &adapters).map(|l| (l, mixed))
        };
        let (logits, mixed) = match result {
            Ok(r) => r,
            Err(_) => {
                self.prefill(jobs.into_iter().zip(caches).collect());
                self.stats.active.store(self.active.len(), Ordering::Relaxed);
                if !self.active.is_empty() {
                    self.step();
                }
                return;
            }
        };
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats.rows.fetch_add(n as u64, Ordering::Relaxed);
        if mixed {
            self.stats.mixed_steps.fetch_add(1, Ordering::Relaxed);
        }
        let vocab = self.model.config().vocab_size;
        let mut rows = logits.chunks(vocab);
        let mut keep = Vec::with_capacity(n + jobs.len());
        for (mut s, row) in std::mem::take(&mut self.active).into_iter().zip(rows.by_ref()) {
            if self.draw(&mut s, row) {
                keep.push(s);
            } else {
                self.retire(s);
            }
        }
        for ((job, caches), row) in jobs.into_iter().zip(caches).zip(rows) {
            let context = job.prompt.clone();
            let mut slot = Slot { job, caches, context, drawn: Vec::new(), sent: 0 };
            if self.draw(&mut slot, row) {
                keep.push(slot);
            } else {
                self.retire(slot);
            }
        }
        self.active = keep;
        self.stats.active.store(self.active.len(), Ordering::Relaxed);
    }

    /// Keeps a finished request's cache for the prompts that start as its did.
    fn retire(&mut self, s: Slot) {
        if !self.model.is_quantized() || s.caches.len() < MIN_REUSE {
            return;
        }
        let held = s.caches.len();
        let mut ids = s.context;
        ids.truncate(held);
        self.pool.push((ids, s.job.adapter, s.caches));
        if self.pool.len() > POOL {
            self.pool.remove(0);
        }
    }

    /// One prefill pass over `jobs` (each alone if the joint pass is refused, so a request's
    /// refusal reaches it alone), each after what its cache already holds, then each one's
    /// first token.
    fn prefill(&mut self, jobs: Vec<(Job, KvCaches)>) {
        let (jobs, mut caches): (Vec<Job>, Vec<KvCaches>) = jobs.into_iter().unzip();
        let pieces: Vec<&[u32]> = jobs.iter().zip(&caches).map(|(j, c)| &j.prompt[c.len()..]).collect();
        let adapters: Vec<Option<&str>> = jobs.iter().map(|j| j.adapter.as_deref()).collect();
        let result = if !self.model.is_quantized() {
            self.model.forward_cached_with(pieces[0], &mut caches[0], adapters[0])
        } else {
            let mut refs: Vec<&mut KvCaches> = caches.iter_mut().collect();
            self.model.forward_cached_many(&pieces, &mut refs, &adapters)
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) if jobs.len() == 1 => {
                let _ = jobs[0].events.send(Event::Failed(e.to_string()));
                return;
            }
            Err(_) => {
                for pair in jobs.into_iter().zip(caches) {
                    self.prefill(vec![pair]);
                }
                return;
            }
        };
        let vocab = self.model.config().vocab_size;
        for ((job, caches), row) in jobs.into_iter().zip(caches).zip(logits.chunks(vocab)) {
            let context = job.prompt.clone();
            let mut slot = Slot { job, caches, context, drawn: Vec::new(), sent: 0 };
            if self.draw(&mut slot, row) {
                self.active.push(slot);
            } else {
                self.retire(slot);
            }
        }
    }

    /// Draws `s`'s next token from `logits` and sends its text; false when the reply ended
    /// (its last event sent) or its client left.
    fn draw(&self, s: &mut Slot, logits: &[f32]) -> bool {
        if s.job.events.is_closed() {
            return false;
        }
        let id = match s.job.sampler.sample(logits, &s.context) {
            Ok(id) => id,
            Err(e) => {
                let _ = s.job.events.send(Event::Failed(e.to_string()));
                return false;
            }
        };
        let context_len = self.model.config().max_seq_len;
        let mut finish = None;
        if self.end_ids.contains(&id) {
            finish = Some(Finish::Stop);
        } else {
            s.drawn.push(id);
            s.context.push(id);
            let text = self.tokenizer.decode(&s.drawn, false).unwrap_or_default();
            // A stop string ends the reply before it; a character still missing bytes (the
            // replacement character at the end) waits for the next token.
            let (end, stopped) = match s.job.stops.iter().filter_map(|p| text.find(p.as_str())).min() {
                Some(at) => (at, true),
                None if text.ends_with('\u{FFFD}') => (s.sent, false),
                None => (text.len(), false),
            };
            if end > s.sent && text.is_char_boundary(s.sent) && text.is_char_boundary(end) {
                let _ = s.job.events.send(Event::Text(text[s.sent..end].to_string()));
                s.sent = end;
            }
            if stopped {
                finish = Some(Finish::Stop);
            } else if s.drawn.len() >= s.job.max_tokens || s.context.len() >= context_len {
                finish = Some(Finish::Length);
            }
        }
        match finish {
            Some(finish) => {
                let _ = s.job.events.send(Event::Done { finish, completion_tokens: s.drawn.len() });
                false
            }
            None => true,
        }
    }

    /// One batched step over the active requests `rows` (their last ids in `ids`, their
    /// adapters in `names`): the logits `(rows.len(), vocab_size)`, in `rows`' order.
    fn rows_step(
        &mut self, ids: &[u32], rows: &[usize], names: &[Option<String>],
    ) -> Result<Vec<f32>, String> {
        let step_ids: Vec<u32> = rows.iter().map(|&i| ids[i]).collect();
        let adapters: Vec<Option<&str>> = rows.iter().map(|&i| names[i].as_deref()).collect();
        let mut caches: Vec<&mut KvCaches> = Vec::with_capacity(rows.len());
        let mut want = rows.iter().peekable();
        for (i, s) in self.active.iter_mut().enumerate() {
            if want.peek() == Some(&&i) {
                want.next();
                caches.push(&mut s.caches);
            }
        }
        self.model.forward_cached_rows_with(&step_ids, &mut caches, &adapters).map_err(|e| e.to_string())
    }

    /// Runs every active request's last token through the model in one step, then draws
    /// each one's next; the finished and the abandoned leave.
    fn step(&mut self) {
        self.active.retain(|s| !s.job.events.is_closed());
        if self.active.is_empty() {
            return;
        }
        let n = self.active.len();
        let vocab = self.model.config().vocab_size;
        let ids: Vec<u32> = self.active.iter().map(|s| *s.context.last().expect("a drawn id")).collect();
        // Each request's own adapters (or the base) on its row of the one step.
        let names: Vec<Option<String>> = self.active.iter().map(|s| s.job.adapter.clone()).collect();
        let mixed = names.iter().any(|a| *a != names[0]);
        let all: Vec<usize> = (0..n).collect();
        let mut failed = vec![None; n];
        let logits = match self.rows_step(&ids, &all, &names) {
            Ok(logits) => {
                self.stats.steps.fetch_add(1, Ordering::Relaxed);
                if mixed {
                    self.stats.mixed_steps.fetch_add(1, Ordering::Relaxed);
                }
                logits
            }
            // Adapters on a mixture-of-experts' routed experts serve a whole step: the rows
            // run again, a step per adapter (every row was checked first: nothing changed).
            Err(_) if mixed => {
                let mut logits = vec![0.0f32; n * vocab];
                let mut kinds = names.clone();
                kinds.sort();
                kinds.dedup();
                for kind in kinds {
                    let rows: Vec<usize> = (0..n).filter(|&i| names[i] == kind).collect();
                    match self.rows_step(&ids, &rows, &names) {
                        Ok(out) => {
                            self.stats.steps.fetch_add(1, Ordering::Relaxed);
                            for (row, &i) in out.chunks(vocab).zip(&rows) {
                                logits[i * vocab..(i + 1) * vocab].copy_from_slice(row);
                            }
                        }
                        Err(e) => rows.iter().for_each(|&i| failed[i] = Some(e.clone())),
                    }
                }
                logits
            }
            // The step failed as a whole: each request hears why, and the thread goes on
            // with the next ones.
            Err(e) => {
                failed.iter_mut().for_each(|f| *f = Some(e.clone()));
                vec![0.0f32; n * vocab]
            }
        };
        self.stats.rows.fetch_add(failed.iter().filter(|f| f.is_none()).count() as u64, Ordering::Relaxed);
        let mut keep = Vec::with_capacity(n);
        for ((mut s, row), failure) in
            std::mem::take(&mut self.active).into_iter().zip(logits.chunks(vocab)).zip(failed)
        {
            if let Some(e) = failure {
                let _ = s.job.events.send(Event::Failed(e));
            } else if self.draw(&mut s, row) {
                keep.push(s);
            } else {
                self.retire(s);
            }
        }
        self.active = keep;
        self.stats.active.store(self.active.len(), Ordering::Relaxed);
    }
}
