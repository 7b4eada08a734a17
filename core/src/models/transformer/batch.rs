//! A batch of token sequences with its targets and loss mask.

use super::*;

/// Token ids of a training or evaluation batch: `inputs[b][t]` predicts `targets[b][t]`,
/// and `mask[b][t]` says whether that prediction counts in the loss. Row-major, `batch` rows
/// of `seq` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Rows.
    pub batch: usize,
    /// Positions per row.
    pub seq: usize,
    /// `batch x seq` input ids.
    pub inputs: Vec<u32>,
    /// `batch x seq` ids each position predicts.
    pub targets: Vec<u32>,
    /// `batch x seq`: whether a position's prediction counts in the loss.
    pub mask: Vec<bool>,
}

impl TokenBatch {
    /// Next-token batches from equal-length sequences of at least two ids: inputs are
    /// `seq[..n-1]`, targets `seq[1..]`, every position counts. The rows may be owned or
    /// borrowed: `TokenBatch::new(rows)`, `TokenBatch::new(&rows)`, `TokenBatch::new(&rows[1..])`.
    pub fn new(seqs: impl AsRef<[Vec<u32>]>) -> Result<TokenBatch> {
        let seqs = seqs.as_ref();
        let first = seqs.first().ok_or_else(|| batch_err("the batch holds no sequences".into()))?;
        let n = first.len();
        if n < 2 {
            return Err(batch_err(format!(
                "sequence 0 has {n} tokens; next-token prediction needs at least 2"
            )));
        }
        if let Some((i, s)) = seqs.iter().enumerate().find(|(_, s)| s.len() != n) {
            return Err(batch_err(format!(
                "sequence {i} has {} tokens but sequence 0 has {n}; TokenBatch::new needs equal lengths",
                s.len()
            )));
        }
        let seq = n - 1;
        let mut inputs = Vec::with_capacity(seqs.len() * seq);
        let mut targets = Vec::with_capacity(seqs.len() * seq);
        for s in seqs {
            inputs.extend_from_slice(&s[..seq]);
            targets.extend_from_slice(&s[1..]);
        }
        Ok(TokenBatch { batch: seqs.len(), seq, mask: alloc::vec![true; inputs.len()], inputs, targets })
    }

    /// Supervised fine-tuning rows: each pair is concatenated, right-padded (id 0) to the
    /// longest, and only predictions of response tokens count in the loss.
    pub fn supervised(pairs: &[(Vec<u32>, Vec<u32>)]) -> Result<TokenBatch> {
        if pairs.is_empty() {
            return Err(batch_err("the batch holds no (prompt, response) pairs".into()));
        }
        if let Some(i) = pairs.iter().position(|(p, r)| p.is_empty() || r.is_empty()) {
            return Err(batch_err(format!("pair {i} has an empty prompt or response")));
        }
        let longest = pairs.iter().map(|(p, r)| p.len() + r.len()).max().unwrap_or(0);
        let seq = longest - 1;
        let mut batch = TokenBatch {
            batch: pairs.len(),
            seq,
            inputs: alloc::vec![0; pairs.len() * seq],
            targets: alloc::vec![0; pairs.len() * seq],
            mask: alloc::vec![false; pairs.len() * seq],
        };
        for (b, (prompt, response)) in pairs.iter().enumerate() {
            let row: Vec<u32> = prompt.iter().chain(response).copied().collect();
            for t in 0..row.len() - 1 {
                batch.inputs[b * seq + t] = row[t];
                batch.targets[b * seq + t] = row[t + 1];
                // The prediction of token t + 1 counts when that token is in the response.
                batch.mask[b * seq + t] = t + 1 >= prompt.len();
            }
        }
        Ok(batch)
    }

    /// Replaces the loss mask with `flags` (`batch * seq` of them, row-major).
    pub fn with_loss_mask(mut self, flags: Vec<bool>) -> Result<TokenBatch> {
        if flags.len() != self.inputs.len() {
            return Err(batch_err(format!(
                "{} mask flags for a batch of {} x {} = {} positions",
                flags.len(),
                self.batch,
                self.seq,
                self.inputs.len()
            )));
        }
        self.mask = flags;
        Ok(self)
    }

    /// Checks the layout and every id that is read: all inputs, and the targets of counted
    /// positions (padding may hold anything).
    pub fn check(&self, vocab: usize) -> Result<()> {
        let n = self.batch * self.seq;
        for (what, len) in
            [("inputs", self.inputs.len()), ("targets", self.targets.len()), ("mask", self.mask.len())]
        {
            crate::error::check_len("token batch", what, len, n)?;
        }
        let bad = |what, i: usize, id: u32| CoreError::TokenOutOfRange {
            what,
            id,
            row: i / self.seq,
            position: i % self.seq,
            vocab,
        };
        if let Some(i) = self.inputs.iter().position(|&t| t as usize >= vocab) {
            return Err(bad("input", i, self.inputs[i]));
        }
        if let Some(i) = (0..n).find(|&i| self.mask[i] && self.targets[i] as usize >= vocab) {
            return Err(bad("target", i, self.targets[i]));
        }
        Ok(())
    }

    /// Positions whose prediction counts in the loss.
    pub fn counted(&self) -> usize {
        self.mask.iter().filter(|&&m| m).count()
    }
}

pub(super) fn batch_err(message: String) -> CoreError {
    CoreError::InvalidArgument { op: "token batch", message }
}
