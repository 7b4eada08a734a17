//! The memory family on this backend.

use super::*;
use crate::backend::cuda::drv;
use crate::backend::cuda::grid;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::error::check_len;
use rusting_brain_core::error::check_range;
use rusting_brain_core::Result;

impl Memory for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn synchronize(&self) -> Result<()> {
        CudaBackend::synchronize(self)
    }
    fn zeros(&self, len: usize) -> Result<CudaBuffer> {
        self.alloc(len)
    }
    fn upload(&self, data: &[f32]) -> Result<CudaBuffer> {
        let mut b = self.alloc(data.len())?;
        if !data.is_empty() {
            self.dev.stream.memcpy_htod(data, &mut b.data).map_err(drv("copying to the device"))?;
        }
        Ok(b)
    }
    fn download(&self, buf: &CudaBuffer) -> Result<Vec<f32>> {
        if buf.len == 0 {
            return Ok(Vec::new());
        }
        self.dev
            .stream
            .clone_dtoh(&buf.data.slice(0..buf.len))
            .map_err(drv("copying from the device (or an earlier kernel failed)"))
    }
    fn write(&self, dst: &mut CudaBuffer, data: &[f32]) -> Result<()> {
        check_len("write", "data", data.len(), dst.len)?;
        if data.is_empty() {
            return Ok(());
        }
        self.dev.stream.memcpy_htod(data, &mut dst.data).map_err(drv("copying to the device"))
    }
    fn len(&self, buf: &CudaBuffer) -> usize {
        buf.len
    }
    fn fill(&self, buf: &mut CudaBuffer, value: f32) -> Result<()> {
        let n = buf.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "fill", grid(n); &mut buf.data, &value, &(n as i64))
    }
    fn copy(&self, dst: &mut CudaBuffer, src: &CudaBuffer) -> Result<()> {
        check_len("copy", "src", src.len, dst.len)?;
        self.copy_range(dst, 0, src, 0, src.len)
    }
    fn copy_range(
        &self, dst: &mut CudaBuffer, dst_offset: usize, src: &CudaBuffer, src_offset: usize, len: usize,
    ) -> Result<()> {
        check_range("copy_range", "dst", dst.len, dst_offset, len)?;
        check_range("copy_range", "src", src.len, src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let from = src.data.slice(src_offset..src_offset + len);
        let mut to = dst.data.slice_mut(dst_offset..dst_offset + len);
        self.dev.stream.memcpy_dtod(&from, &mut to).map_err(drv("device copy"))
    }
}
