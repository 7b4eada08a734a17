//! The memory family on this backend.

use crate::backend::device;
use crate::backend::WgpuBackend;
use crate::DenseOp;
use crate::GpuBuffer;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::error::check_len;
use rusting_brain_core::Result;

impl Memory for WgpuBackend {
    type Buffer = GpuBuffer;

    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn zeros(&self, len: usize) -> Result<GpuBuffer> {
        self.gpu.zeros("buffer", len).map_err(device)
    }
    fn upload(&self, data: &[f32]) -> Result<GpuBuffer> {
        self.gpu.upload("buffer", data).map_err(device)
    }
    fn synchronize(&self) -> Result<()> {
        self.flush()?;
        #[cfg(not(target_arch = "wasm32"))]
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| device(crate::ShaderError::Readback(e.to_string())))?;
        self.gpu.check_errors().map_err(device)
    }
    fn download(&self, buf: &GpuBuffer) -> Result<Vec<f32>> {
        self.flush()?;
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.gpu.read_blocking(buf).map_err(device)
        }
        // The browser must never block: a page reads buffers with the async `Gpu::read`.
        #[cfg(target_arch = "wasm32")]
        {
            let _ = buf;
            Err(rusting_brain_core::CoreError::Device {
                backend: "wgpu",
                message: "a blocking read-back is not possible in the browser; use Gpu::read".into(),
            })
        }
    }
    fn write(&self, dst: &mut GpuBuffer, data: &[f32]) -> Result<()> {
        check_len("write", "data", data.len(), dst.len())?;
        // Through a staging buffer and a recorded copy, so the write lands after the work
        // recorded before it and before the work recorded after it.
        self.record(|b, pools| {
            let staged = pools.stage_f32(data)?;
            b.copy(dst, 0, &staged, 0, data.len())
        })
    }
    fn len(&self, buf: &GpuBuffer) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut GpuBuffer, value: f32) -> Result<()> {
        let n = buf.len();
        self.dense(DenseOp::Fill(value), [None; 3], buf, 1, n)
    }
    fn copy(&self, dst: &mut GpuBuffer, src: &GpuBuffer) -> Result<()> {
        check_len("copy", "src", src.len(), dst.len())?;
        let n = dst.len();
        self.record(|b, _| b.copy(dst, 0, src, 0, n))
    }
    fn copy_range(
        &self, dst: &mut GpuBuffer, dst_offset: usize, src: &GpuBuffer, src_offset: usize, len: usize,
    ) -> Result<()> {
        self.record(|b, _| b.copy(dst, dst_offset, src, src_offset, len))
    }
    fn max_binding_len(&self) -> usize {
        usize::try_from(self.gpu.max_binding() / 4).unwrap_or(usize::MAX)
    }
}
