//! An output buffer the tasks of one parallel call reach through a raw pointer, each
//! writing elements no other task reads or writes at the same time. For outputs no task
//! can hold as its own `&mut` sub-slice: a blocked attention's (batch, head) rows are
//! strided through the whole buffer, and the parts of a phased team job write their band
//! in one phase and read the whole buffer in the next, through one shared closure.
//! Writing in place spares task-local copies and the serial gather that followed them.

pub(crate) struct SharedBuf<'a> {
    ptr: *mut f32,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the pointer comes from a `&'a mut [f32]` held for 'a, so only the tasks reach the
// buffer while it lives, under the access rules of the methods below (see the SAFETY notes
// at the calls).
unsafe impl Send for SharedBuf<'_> {}
unsafe impl Sync for SharedBuf<'_> {}

impl<'a> SharedBuf<'a> {
    pub(crate) fn new(buf: &'a mut [f32]) -> Self {
        SharedBuf { ptr: buf.as_mut_ptr(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// Elements `start..end`, to write.
    ///
    /// # Safety
    /// No other task reads or writes them while the slice lives.
    #[allow(clippy::mut_from_ref, reason = "disjoint parts of a buffer lent to the tasks")]
    pub(crate) unsafe fn band(&self, start: usize, end: usize) -> &mut [f32] {
        assert!(start <= end && end <= self.len, "a band outside its buffer");
        std::slice::from_raw_parts_mut(self.ptr.add(start), end - start)
    }

    /// The whole buffer, to read.
    ///
    /// # Safety
    /// No task writes any of it while the slice lives.
    pub(crate) unsafe fn all(&self) -> &[f32] {
        std::slice::from_raw_parts(self.ptr, self.len)
    }

    /// `buf[start + i] = src[i] * mul` (`mul` 1 copies exactly).
    ///
    /// # Safety
    /// As for [`SharedBuf::band`], over `start..start + src.len()`.
    pub(crate) unsafe fn put(&self, start: usize, src: &[f32], mul: f32) {
        let end = start.checked_add(src.len()).expect("a band outside its buffer");
        for (d, &v) in self.band(start, end).iter_mut().zip(src) {
            *d = v * mul;
        }
    }

    /// `buf[start..start + len] = 0`.
    ///
    /// # Safety
    /// As for [`SharedBuf::band`], over `start..start + len`.
    pub(crate) unsafe fn zero(&self, start: usize, len: usize) {
        let end = start.checked_add(len).expect("a band outside its buffer");
        self.band(start, end).fill(0.0);
    }
}
