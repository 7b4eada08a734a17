//! `Dataset`: rows of inputs and targets, and the loaders that fill it from disk.

mod csv;
mod idx;
#[cfg(feature = "images")]
mod images;
mod npy;

use std::collections::BTreeMap;
use std::path::Path;

use rusting_brain_core::Rng;

use crate::{NetworkError, Result};

/// Rows of `f32` inputs with their targets, all inputs one width and all targets another.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dataset {
    inputs: Vec<Vec<f32>>,
    targets: Vec<Vec<f32>>,
}

/// The seed `split` and `split_stratified` shuffle with, so a split is the same every run.
pub const SPLIT_SEED: u64 = 0x5eed;

fn check_rows(what: &str, rows: &[Vec<f32>]) -> Result<()> {
    if let Some(first) = rows.first() {
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != first.len()) {
            return Err(NetworkError::InvalidInput(format!(
                "{what} row {i} has {} values but row 0 has {}",
                r.len(),
                first.len()
            )));
        }
    }
    Ok(())
}

impl Dataset {
    /// Checks that there are as many targets as inputs and that no row is ragged.
    pub fn new(inputs: Vec<Vec<f32>>, targets: Vec<Vec<f32>>) -> Result<Dataset> {
        if inputs.len() != targets.len() {
            return Err(NetworkError::InvalidInput(format!(
                "{} input rows but {} target rows",
                inputs.len(),
                targets.len()
            )));
        }
        check_rows("input", &inputs)?;
        check_rows("target", &targets)?;
        Ok(Dataset { inputs, targets })
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }
    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }
    /// The input rows.
    pub fn inputs(&self) -> &[Vec<f32>] {
        &self.inputs
    }
    /// The target rows, one per input row.
    pub fn targets(&self) -> &[Vec<f32>] {
        &self.targets
    }
    /// Width of an input row (0 when empty).
    pub fn input_size(&self) -> usize {
        self.inputs.first().map_or(0, Vec::len)
    }
    /// Width of a target row (0 when empty).
    pub fn target_size(&self) -> usize {
        self.targets.first().map_or(0, Vec::len)
    }

    /// Reads a numeric CSV whose last `target_columns` columns are the target. A first row
    /// with no number in it is a header and is skipped (one with some numbers is data, so a
    /// typo in a file without a header is an error naming it, not a row dropped); quoted
    /// fields, CRLF line ends and blank lines are understood. Errors name the line and column.
    pub fn from_csv(path: impl AsRef<Path>, target_columns: usize) -> Result<Dataset> {
        let path = path.as_ref();
        let records = csv::read_records(path)?;
        let body = skip_header(&records, |fields| fields.iter().all(|f| csv::number(f).is_none()));
        let width = body.first().map(|r| r.fields.len()).ok_or_else(|| no_rows(path))?;
        if target_columns == 0 || target_columns >= width {
            return Err(NetworkError::InvalidInput(format!(
                "{}: {target_columns} target columns asked for, but the rows have {width} columns (need 1..={})",
                path.display(),
                width - 1
            )));
        }
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for rec in body {
            let values = numeric_fields(path, rec, width, width)?;
            let (x, y) = values.split_at(width - target_columns);
            inputs.push(x.to_vec());
            targets.push(y.to_vec());
        }
        Ok(Dataset { inputs, targets })
    }

    /// Reads a CSV whose last column is a class name (`5.1,3.5,1.4,0.2,setosa`): the other
    /// columns are the inputs, the targets are one-hot, and the class names come back sorted
    /// (target column `i` is `classes[i]`). A first row with no number among its input
    /// columns is a header and is skipped.
    pub fn from_csv_labeled(path: impl AsRef<Path>) -> Result<(Dataset, Vec<String>)> {
        let path = path.as_ref();
        let records = csv::read_records(path)?;
        let body = skip_header(&records, |fields| {
            fields[..fields.len().saturating_sub(1)].iter().all(|f| csv::number(f).is_none())
        });
        let width = body.first().map(|r| r.fields.len()).ok_or_else(|| no_rows(path))?;
        if width < 2 {
            return Err(NetworkError::parse(
                path,
                format!("line {}", body[0].line),
                "need at least one input column and a label",
            ));
        }
        let mut classes: BTreeMap<String, usize> = BTreeMap::new();
        let mut rows = Vec::new();
        for rec in body {
            let values = numeric_fields(path, rec, width, width - 1)?;
            let label = rec.fields[width - 1].trim().to_string();
            if label.is_empty() {
                return Err(NetworkError::parse(
                    path,
                    format!("line {}, column {width}", rec.line),
                    "the class label is empty",
                ));
            }
            classes.entry(label.clone()).or_insert(0);
            rows.push((values, label));
        }
        let names: Vec<String> = classes.keys().cloned().collect();
        for (i, v) in classes.values_mut().enumerate() {
            *v = i;
        }
        let (mut inputs, mut targets) = (Vec::new(), Vec::new());
        for (x, label) in rows {
            let mut t = vec![0.0; names.len()];
            t[classes[&label]] = 1.0;
            inputs.push(x);
            targets.push(t);
        }
        Ok((Dataset { inputs, targets }, names))
    }

    /// Reads inputs and targets from two `.npy` files (as `numpy.save` writes them):
    /// float32/64, int32/64 or uint8, C order, 1-D (one column) or 2-D, equal row counts.
    pub fn from_npy(x: impl AsRef<Path>, y: impl AsRef<Path>) -> Result<Dataset> {
        let (xa, ya) = (npy::read(x.as_ref())?, npy::read(y.as_ref())?);
        if xa.rows != ya.rows {
            return Err(NetworkError::InvalidInput(format!(
                "{} has {} rows but {} has {}",
                x.as_ref().display(),
                xa.rows,
                y.as_ref().display(),
                ya.rows
            )));
        }
        let split = |a: npy::Array| -> Vec<Vec<f32>> {
            if a.cols == 0 {
                vec![Vec::new(); a.rows]
            } else {
                a.data.chunks_exact(a.cols).map(<[f32]>::to_vec).collect()
            }
        };
        Ok(Dataset { inputs: split(xa), targets: split(ya) })
    }

    /// Reads an IDX image file and its label file (MNIST layout, gunzipped): each image
    /// becomes one row of pixels scaled to 0.0..=1.0, each label a one-column class index
    /// (call [`Dataset::one_hot_targets`] next).
    pub fn from_idx(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<Dataset> {
        let (images, labels) = (images.as_ref(), labels.as_ref());
        let (idims, pixels) = idx::read(images, 3)?;
        let (ldims, labs) = idx::read(labels, 1)?;
        if idims[0] != ldims[0] {
            return Err(NetworkError::InvalidInput(format!(
                "{} holds {} images but {} holds {} labels",
                images.display(),
                idims[0],
                labels.display(),
                ldims[0]
            )));
        }
        let per = idims[1] * idims[2];
        let inputs = if per == 0 {
            vec![Vec::new(); idims[0]]
        } else {
            pixels.chunks_exact(per).map(|img| img.iter().map(|&p| p as f32 / 255.0).collect()).collect()
        };
        Ok(Dataset { inputs, targets: labs.iter().map(|&l| vec![l as f32]).collect() })
    }

    /// Loads an image folder (one subfolder per class, sorted by name), resized to
    /// `width` x `height`, flattened to a row in 0.0..=1.0: `height * width` values for
    /// grayscale, or three planes of them (R, G, B) for colour. Targets are one-hot; the
    /// class names come back beside the data.
    #[cfg(feature = "images")]
    pub fn from_image_folder(
        dir: impl AsRef<Path>, width: u32, height: u32, grayscale: bool,
    ) -> Result<(Dataset, Vec<String>)> {
        images::read_folder(dir.as_ref(), width, height, grayscale)
    }

    /// Turns one-column class indices into one-hot rows of width `classes`.
    pub fn one_hot_targets(&mut self, classes: usize) -> Result<()> {
        if classes == 0 {
            return Err(NetworkError::InvalidInput("one_hot_targets needs at least one class".into()));
        }
        if self.target_size() != 1 && !self.is_empty() {
            return Err(NetworkError::InvalidInput(format!(
                "one_hot_targets needs one target column holding class indices, the targets have {}",
                self.target_size()
            )));
        }
        let mut out = Vec::with_capacity(self.len());
        for (row, t) in self.targets.iter().enumerate() {
            let v = t[0];
            if v.fract() != 0.0 || v < 0.0 || v as usize >= classes {
                return Err(NetworkError::InvalidInput(format!(
                    "target row {row} holds {v}, which is not a class index below {classes}"
                )));
            }
            let mut o = vec![0.0; classes];
            o[v as usize] = 1.0;
            out.push(o);
        }
        self.targets = out;
        Ok(())
    }

    /// Shuffles (with [`SPLIT_SEED`]) and splits: the first part holds `round(fraction * len)`
    /// rows. `fraction` is clamped to 0..=1.
    pub fn split(&self, fraction: f32) -> (Dataset, Dataset) {
        self.split_seeded(fraction, SPLIT_SEED)
    }

    /// [`Dataset::split`] with a seed of your own.
    pub fn split_seeded(&self, fraction: f32, seed: u64) -> (Dataset, Dataset) {
        let mut order: Vec<usize> = (0..self.len()).collect();
        Rng::new(seed).shuffle(&mut order);
        let cut = cut_point(fraction, order.len());
        (self.pick(&order[..cut]), self.pick(&order[cut..]))
    }

    /// Like [`Dataset::split`], but each class (the argmax of a one-hot target, or the target
    /// value itself for one column) keeps its share on both sides.
    pub fn split_stratified(&self, fraction: f32) -> (Dataset, Dataset) {
        let mut by_class: BTreeMap<Vec<u32>, Vec<usize>> = BTreeMap::new();
        for (i, t) in self.targets.iter().enumerate() {
            by_class.entry(class_key(t)).or_default().push(i);
        }
        let mut rng = Rng::new(SPLIT_SEED);
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for (_, mut rows) in by_class {
            rng.shuffle(&mut rows);
            let cut = cut_point(fraction, rows.len());
            first.extend_from_slice(&rows[..cut]);
            second.extend_from_slice(&rows[cut..]);
        }
        // Interleave the classes again, so batches taken in order are mixed.
        rng.shuffle(&mut first);
        rng.shuffle(&mut second);
        (self.pick(&first), self.pick(&second))
    }

    fn pick(&self, rows: &[usize]) -> Dataset {
        Dataset {
            inputs: rows.iter().map(|&i| self.inputs[i].clone()).collect(),
            targets: rows.iter().map(|&i| self.targets[i].clone()).collect(),
        }
    }

    /// Centers every input column and scales it to unit variance, in place, and returns the
    /// statistics so the same transform can be applied to other data. A constant column is
    /// only centered.
    pub fn standardize(&mut self) -> Statistics {
        let n = self.len().max(1) as f64;
        let w = self.input_size();
        let mut mean = vec![0.0f64; w];
        for r in &self.inputs {
            for (m, &v) in mean.iter_mut().zip(r) {
                *m += v as f64;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        let mut var = vec![0.0f64; w];
        for r in &self.inputs {
            for ((s, &v), &m) in var.iter_mut().zip(r).zip(&mean) {
                *s += (v as f64 - m).powi(2);
            }
        }
        let stats = Statistics {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std: var
                .iter()
                .map(|&s| (s / n).sqrt())
                .map(|s| if s > 1e-12 { s as f32 } else { 1.0 })
                .collect(),
        };
        for r in &mut self.inputs {
            stats.transform(r);
        }
        stats
    }

    /// Appends a mirrored copy of every image row, with its target. Rows are read as
    /// planes of `width`-pixel lines (grayscale, or the R, G, B planes of
    /// `Dataset::from_image_folder`, feature `images`), so `input_size` must be a multiple of `width`.
    pub fn flip_horizontal(&mut self, width: usize) -> Result<()> {
        let w = self.input_size();
        if width == 0 || !w.is_multiple_of(width) {
            return Err(NetworkError::InvalidInput(format!(
                "flip_horizontal({width}): the rows have {w} values, not a whole number of {width}-pixel lines"
            )));
        }
        let n = self.len();
        for i in 0..n {
            let mut row = self.inputs[i].clone();
            for line in row.chunks_exact_mut(width) {
                line.reverse();
            }
            self.inputs.push(row);
            self.targets.push(self.targets[i].clone());
        }
        Ok(())
    }
}

/// Per-column mean and standard deviation of a training split (see [`Dataset::standardize`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Statistics {
    /// Each column's mean.
    pub mean: Vec<f32>,
    /// Each column's standard deviation (1 where a column is constant).
    pub std: Vec<f32>,
}

impl Statistics {
    fn transform(&self, row: &mut [f32]) {
        for ((v, &m), &s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
            *v = (*v - m) / s;
        }
    }

    /// Standardizes every input row of `data` with these statistics.
    pub fn apply(&self, data: &mut Dataset) -> Result<()> {
        if !data.is_empty() && data.input_size() != self.mean.len() {
            return Err(NetworkError::InvalidInput(format!(
                "the statistics are for {} input columns but the data has {}",
                self.mean.len(),
                data.input_size()
            )));
        }
        for r in &mut data.inputs {
            self.transform(r);
        }
        Ok(())
    }

    /// Standardizes one row (before predicting on it).
    pub fn apply_row(&self, row: &mut [f32]) -> Result<()> {
        if row.len() != self.mean.len() {
            return Err(NetworkError::InvalidInput(format!(
                "the statistics are for {} input columns but the row has {}",
                self.mean.len(),
                row.len()
            )));
        }
        self.transform(row);
        Ok(())
    }
}

fn cut_point(fraction: f32, len: usize) -> usize {
    let f = if fraction.is_nan() { 0.0 } else { fraction.clamp(0.0, 1.0) };
    ((f as f64 * len as f64).round() as usize).min(len)
}

/// The class of a target row: its argmax when one-hot, else its bits.
fn class_key(t: &[f32]) -> Vec<u32> {
    if t.len() > 1 {
        let arg = t.iter().enumerate().fold(0, |best, (i, &v)| if v > t[best] { i } else { best });
        vec![arg as u32]
    } else {
        t.iter().map(|v| v.to_bits()).collect()
    }
}

fn no_rows(path: &Path) -> NetworkError {
    NetworkError::parse(path, "line 1", "the file has no data rows")
}

fn skip_header(records: &[csv::Record], is_header: impl Fn(&[String]) -> bool) -> &[csv::Record] {
    match records.first() {
        Some(first) if is_header(&first.fields) => &records[1..],
        _ => records,
    }
}

/// The first `numeric` fields of a record as numbers, after checking its width.
fn numeric_fields(path: &Path, rec: &csv::Record, width: usize, numeric: usize) -> Result<Vec<f32>> {
    if rec.fields.len() != width {
        return Err(NetworkError::parse(
            path,
            format!("line {}", rec.line),
            format!("{} fields, but the first data row has {width}", rec.fields.len()),
        ));
    }
    rec.fields[..numeric]
        .iter()
        .enumerate()
        .map(|(c, f)| {
            csv::number(f).ok_or_else(|| {
                NetworkError::parse(
                    path,
                    format!("line {}, column {}", rec.line, c + 1),
                    format!("`{}` is not a finite number", f.trim()),
                )
            })
        })
        .collect()
}
