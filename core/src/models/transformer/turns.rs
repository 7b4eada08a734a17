//! One conversation's bookkeeping, shared by every engine that decodes a
//! [`super::TransformerModel`] (native `Decoder` and `generate`, the browser engine): which
//! ids a feed may take, what happens to a drawn id, and when a reply ends. The engines
//! keep only what differs between them: where the model runs and how a draw waits.

use alloc::format;
use alloc::vec::Vec;

use super::TransformerConfig;
use crate::{CoreError, Result};

/// The ids of one conversation and the model's limits they are checked against.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Every id fed or drawn since the last clear (the repetition penalty's context).
    context: Vec<u32>,
    vocab: usize,
    max_seq_len: usize,
}

impl Conversation {
    /// An empty conversation within `config`'s vocabulary and context.
    pub fn new(config: &TransformerConfig) -> Self {
        Conversation { context: Vec::new(), vocab: config.vocab_size, max_seq_len: config.max_seq_len }
    }

    /// Every id fed or drawn so far.
    pub fn context(&self) -> &[u32] {
        &self.context
    }

    /// Positions the model can still read (`max_seq_len` less the context).
    pub fn room(&self) -> usize {
        self.max_seq_len.saturating_sub(self.context.len())
    }

    /// Forgets the conversation.
    pub fn clear(&mut self) {
        self.context.clear();
    }

    /// What a feed of `ids` must pass before the model reads any of it, so a refused
    /// feed changes nothing: at least one id, every id inside the vocabulary, and room
    /// for all of them.
    pub fn check_feed(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(CoreError::InvalidArgument {
                op: "feed",
                message: "nothing to feed: the prompt has no tokens".into(),
            });
        }
        if let Some(i) = ids.iter().position(|&t| t as usize >= self.vocab) {
            return Err(CoreError::TokenOutOfRange {
                what: "input",
                id: ids[i],
                row: 0,
                position: self.context.len() + i,
                vocab: self.vocab,
            });
        }
        if ids.len() > self.room() {
            return Err(CoreError::InvalidDimension {
                op: "feed",
                message: format!(
                    "{} tokens in the conversation + {} new is over the model's max_seq_len {}: \
                     start a new conversation (reset, or a new decoder)",
                    self.context.len(),
                    ids.len(),
                    self.max_seq_len
                ),
            });
        }
        Ok(())
    }

    /// Records ids the model has read.
    pub fn fed(&mut self, ids: &[u32]) {
        self.context.extend_from_slice(ids);
    }

    /// Records a drawn id: `true` when the model has room to read it next (the caller
    /// feeds it, which records it); `false` when the cache is full, and the id is kept
    /// in the context as the reply's last.
    pub fn drawn(&mut self, id: u32) -> bool {
        if self.room() > 0 {
            return true;
        }
        self.context.push(id);
        false
    }
}

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `max_new` ids were drawn.
    Length,
    /// The end id was drawn (it is not part of the reply).
    End,
    /// The caller's callback said stop.
    Stopped,
    /// The model's cache is full (`max_seq_len`).
    MaxSeqLen,
}

impl Finish {
    /// "length", "end", "stopped", "max_seq_len".
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::End => "end",
            Finish::Stopped => "stopped",
            Finish::MaxSeqLen => "max_seq_len",
        }
    }
}

/// What to do after a draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Feed the id back (the conversation continues from it); `stop` says the reply
    /// ends there all the same ([`Finish::Stopped`]).
    Feed {
        /// The reply ends after this id all the same.
        stop: bool,
    },
    /// The reply is over.
    Done(Finish),
}

/// One reply being generated: up to `max_new` ids, ending early at `end`, at a full
/// cache, or when the caller says stop. The loop every engine runs is
///
/// ```text
/// feed the prompt
/// loop {
///     if let Some(f) = reply.before_draw() { break f }
///     let id = draw;
///     match reply.drawn(&mut conversation, id, &mut on_token) {
///         Turn::Done(f) => break f,
///         Turn::Feed { stop } => { feed [id]; if stop { break Finish::Stopped } }
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Reply {
    ids: Vec<u32>,
    max_new: usize,
    end: Option<u32>,
}

impl Reply {
    /// A reply of at most `max_new` ids, ending early at `end` when given.
    pub fn new(max_new: usize, end: Option<u32>) -> Self {
        Reply { ids: Vec::new(), max_new, end }
    }

    /// `Some` when no more ids may be drawn.
    pub fn before_draw(&self) -> Option<Finish> {
        (self.ids.len() >= self.max_new).then_some(Finish::Length)
    }

    /// Takes a drawn id: hands it to `on_token` (whose `false` means stop) unless it is
    /// the end id, and says whether it is fed back.
    pub fn drawn(
        &mut self, conversation: &mut Conversation, id: u32, on_token: impl FnOnce(u32) -> bool,
    ) -> Turn {
        if Some(id) == self.end {
            return Turn::Done(Finish::End);
        }
        self.ids.push(id);
        let go_on = on_token(id);
        if !conversation.drawn(id) {
            return Turn::Done(Finish::MaxSeqLen);
        }
        Turn::Feed { stop: !go_on }
    }

    /// The ids drawn so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The reply's ids.
    pub fn into_ids(self) -> Vec<u32> {
        self.ids
    }
}
