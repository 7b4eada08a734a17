//! `TokenFile`: a corpus of token ids on disk (flat little-endian u32), read a window at a
//! time so only the batch is resident.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rusting_brain_core::Rng;

use crate::{NetworkError, Result, TokenBatch};

/// An open token file; see the module docs.
pub struct TokenFile {
    path: PathBuf,
    file: File,
    len: usize,
    seed: u64,
}

fn mix(seed: u64, step: u64) -> u64 {
    // Two SplitMix64-style rounds over (seed, step): neighbouring steps get unrelated streams.
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl TokenFile {
    /// Writes `ids` as a token file (atomically).
    pub fn write(path: impl AsRef<Path>, ids: &[u32]) -> Result<()> {
        let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        crate::io::files::write_atomic(path.as_ref(), &bytes)
    }

    /// Converts a JSONL corpus a line at a time: the string `field` of each line goes
    /// through `tokenize`, its ids (then `eos`, if given) are appended to `out` as they
    /// come, so memory stays constant. Blank lines are skipped; a malformed line or a
    /// missing field is an error naming the line, and `out` is only replaced when every
    /// line converted. Returns the number of ids written.
    pub fn write_jsonl(
        out: impl AsRef<Path>, jsonl: impl AsRef<Path>, field: &str, eos: Option<u32>,
        mut tokenize: impl FnMut(&str) -> Vec<u32>,
    ) -> Result<usize> {
        let (out, jsonl) = (out.as_ref(), jsonl.as_ref());
        let input = File::open(jsonl).map_err(|e| NetworkError::io(jsonl, e))?;
        let (_, tmp) = crate::io::files::temporary_for(out)?;
        let result = (|| -> Result<usize> {
            let mut w = BufWriter::new(File::create(&tmp).map_err(|e| NetworkError::io(&tmp, e))?);
            let mut count = 0usize;
            for (i, line) in BufReader::new(input).lines().enumerate() {
                let at = format!("line {}", i + 1);
                let line = line.map_err(|e| NetworkError::parse(jsonl, &at, e.to_string()))?;
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(&line)
                    .map_err(|e| NetworkError::parse(jsonl, &at, format!("malformed JSON: {e}")))?;
                let text = v
                    .get(field)
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| NetworkError::parse(jsonl, &at, format!("no string field \"{field}\"")))?;
                for id in tokenize(text).into_iter().chain(eos) {
                    w.write_all(&id.to_le_bytes()).map_err(|e| NetworkError::io(&tmp, e))?;
                    count += 1;
                }
            }
            let f = w.into_inner().map_err(|e| NetworkError::io(&tmp, e.into_error()))?;
            f.sync_all().map_err(|e| NetworkError::io(&tmp, e))?;
            Ok(count)
        })();
        match result {
            Ok(count) => {
                std::fs::rename(&tmp, out).map_err(|e| NetworkError::io(out, e))?;
                Ok(count)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Opens a token file; `seed` decides which windows [`TokenFile::batch`] reads.
    pub fn open(path: impl AsRef<Path>, seed: u64) -> Result<TokenFile> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| NetworkError::io(&path, e))?;
        let bytes = file.metadata().map_err(|e| NetworkError::io(&path, e))?.len();
        if bytes % 4 != 0 {
            return Err(NetworkError::parse(
                &path,
                "size",
                format!("{bytes} bytes is not a whole number of u32 token ids"),
            ));
        }
        let len = (bytes / 4) as usize;
        if len < 2 {
            return Err(NetworkError::parse(
                &path,
                "size",
                format!("{len} tokens; a corpus needs at least 2"),
            ));
        }
        Ok(TokenFile { path, file, len, seed })
    }

    /// Tokens in the file.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn read(&mut self, start: usize, count: usize, out: &mut Vec<u32>) -> Result<()> {
        let mut buf = vec![0u8; count * 4];
        self.file.seek(SeekFrom::Start(start as u64 * 4)).map_err(|e| NetworkError::io(&self.path, e))?;
        self.file.read_exact(&mut buf).map_err(|e| NetworkError::io(&self.path, e))?;
        out.extend(buf.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        Ok(())
    }

    /// `batch` windows of `seq + 1` tokens at offsets drawn from (seed, step) alone: a run
    /// resumed at step k reads what it would have read, with no cursor to save.
    pub fn batch(&mut self, step: u64, batch: usize, seq: usize) -> Result<TokenBatch> {
        if batch == 0 || seq == 0 {
            return Err(NetworkError::InvalidInput(format!(
                "TokenFile::batch({step}, {batch}, {seq}): batch and seq must be at least 1"
            )));
        }
        if seq + 1 > self.len {
            return Err(NetworkError::InvalidInput(format!(
                "{}: {} tokens cannot hold a window of {seq} + 1",
                self.path.display(),
                self.len
            )));
        }
        let mut rng = Rng::new(mix(self.seed, step));
        let starts = (self.len - seq) as u64; // offsets 0..=len - (seq + 1)
        let mut rows = Vec::with_capacity(batch);
        for _ in 0..batch {
            let start = rng.below(starts) as usize;
            let mut row = Vec::with_capacity(seq + 1);
            self.read(start, seq + 1, &mut row)?;
            rows.push(row);
        }
        Ok(TokenBatch::new(&rows)?)
    }

    /// Chunk `i` of a walk through the file in order: `batch` rows of `seq` predictions,
    /// row r starting at token `(i * batch + r) * seq`, so every token after the first is
    /// predicted exactly once over the whole walk. The last chunk is padded (and the padding
    /// masked out of the loss); past the end, `None`.
    pub fn chunk(&mut self, i: usize, batch: usize, seq: usize) -> Result<Option<TokenBatch>> {
        if batch == 0 || seq == 0 {
            return Err(NetworkError::InvalidInput(format!(
                "TokenFile::chunk({i}, {batch}, {seq}): batch and seq must be at least 1"
            )));
        }
        let predictions = self.len - 1;
        let first = i.checked_mul(batch * seq).filter(|&f| f < predictions);
        let Some(first) = first else { return Ok(None) };
        let rows = (predictions - first).div_ceil(seq).min(batch);
        let mut b = TokenBatch {
            batch: rows,
            seq,
            inputs: vec![0; rows * seq],
            targets: vec![0; rows * seq],
            mask: vec![false; rows * seq],
        };
        for r in 0..rows {
            let start = first + r * seq;
            let take = (seq + 1).min(self.len - start);
            let mut row = Vec::with_capacity(take);
            self.read(start, take, &mut row)?;
            for t in 0..take - 1 {
                b.inputs[r * seq + t] = row[t];
                b.targets[r * seq + t] = row[t + 1];
                b.mask[r * seq + t] = true;
            }
        }
        Ok(Some(b))
    }
}
