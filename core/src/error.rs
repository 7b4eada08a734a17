use alloc::string::String;

/// Everything that can go wrong in a primitive or a backend, with enough context to act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// A buffer does not have the number of elements the shape arguments imply.
    #[error("{op}: `{what}` has {actual} elements but the shape needs {expected}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The buffer.
        what: &'static str,
        /// Elements the shape needs.
        expected: usize,
        /// Elements it has.
        actual: usize,
    },
    /// A dimension that must be positive (a norm's width, a head size, a vocabulary) is zero,
    /// or dimensions are inconsistent with each other.
    #[error("{op}: invalid dimensions: {message}")]
    InvalidDimension {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A token id (or class index) is not below the table size.
    #[error("{op}: id {id} at position {index} is outside the vocabulary ({vocab})")]
    IdOutOfRange {
        /// The operation.
        op: &'static str,
        /// The id.
        id: u32,
        /// Where it is.
        index: usize,
        /// The table's size.
        vocab: usize,
    },
    /// A token id of a batch is not below the vocabulary size.
    #[error(
        "token id {id} at batch row {row}, position {position} ({what}) is outside the vocabulary ({vocab})"
    )]
    TokenOutOfRange {
        /// "input" or "target".
        what: &'static str,
        /// The id.
        id: u32,
        /// Its row of the batch.
        row: usize,
        /// Its position in the row.
        position: usize,
        /// The vocabulary's size.
        vocab: usize,
    },
    /// A hyper-parameter is outside its valid range (negative learning rate, beta >= 1, ...).
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A loss came out NaN or infinite; the inputs were not finite or overflowed.
    #[error("{op}: the result is not finite ({value}); check the inputs for NaN/Inf")]
    NonFinite {
        /// The operation.
        op: &'static str,
        /// The value it came out as.
        value: f64,
    },
    /// A checkpoint's bytes are not what they claim to be (`location`: the header, the
    /// metadata, or a tensor's name).
    #[error("{location}: {message}")]
    Checkpoint {
        /// Where: the header, the metadata, a tensor's name, a line and column.
        location: String,
        /// What is wrong there.
        message: String,
    },
    /// A device backend failed (driver, allocation, kernel launch). Never silently recovered.
    #[error("{backend} backend: {message}")]
    Device {
        /// The backend ("wgpu", "cuda").
        backend: &'static str,
        /// What the device or driver said.
        message: String,
    },
}

/// Checks that a buffer has `expected` elements (shared by every backend's validation).
pub fn check_len(
    op: &'static str, what: &'static str, actual: usize, expected: usize,
) -> Result<(), CoreError> {
    if actual == expected {
        Ok(())
    } else {
        Err(CoreError::ShapeMismatch { op, what, expected, actual })
    }
}

/// Checks that `offset..offset + len` lies inside a buffer of `buf_len` elements.
pub fn check_range(
    op: &'static str, what: &'static str, buf_len: usize, offset: usize, len: usize,
) -> Result<(), CoreError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf_len => Ok(()),
        _ => Err(CoreError::InvalidDimension {
            op,
            message: alloc::format!(
                "`{what}` range {offset}..{offset}+{len} is outside its {buf_len} elements"
            ),
        }),
    }
}

/// Multiplies dimensions, failing instead of wrapping on overflow.
pub fn product(op: &'static str, dims: &[usize]) -> Result<usize, CoreError> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d).ok_or_else(|| CoreError::InvalidDimension {
            op,
            message: alloc::format!("the shape {dims:?} overflows usize"),
        })
    })
}

/// Checks a row-wise op: `cols > 0` and every named buffer holding `rows * cols` elements.
/// Returns `rows * cols`.
pub fn check_rows(
    op: &'static str, rows: usize, cols: usize, bufs: &[(&'static str, usize)],
) -> Result<usize, CoreError> {
    nonzero(op, "cols", cols)?;
    let n = product(op, &[rows, cols])?;
    for &(what, len) in bufs {
        check_len(op, what, len, n)?;
    }
    Ok(n)
}

/// Checks that a dimension `what` is at least 1.
pub fn nonzero(op: &'static str, what: &str, value: usize) -> Result<(), CoreError> {
    if value == 0 {
        Err(CoreError::InvalidDimension { op, message: alloc::format!("{what} must be at least 1") })
    } else {
        Ok(())
    }
}

/// The first of the named fields of a configuration that is zero, as "`field` must be at
/// least 1" (each field named once: the message is its name).
macro_rules! first_zero {
    ($config:expr; $($field:ident),+ $(,)?) => {{
        let c = &$config;
        [$((stringify!($field), c.$field)),+]
            .into_iter()
            .find(|&(_, v)| v == 0)
            .map(|(name, _)| alloc::format!("{name} must be at least 1"))
    }};
}
pub(crate) use first_zero;
