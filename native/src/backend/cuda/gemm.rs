//! Row-major GEMMs on cuBLASLt: FP32 (`CUBLAS_COMPUTE_32F`, no TF32 unless asked) or BF16
//! operands with FP32 accumulation and an FP32 result, batched by strides.
//!
//! cuBLAS is column-major; a row-major `C (m, n) = op(A) op(B)` is the column-major
//! `C^T (n, m) = op(B)^T op(A)^T`, so B goes in as cuBLAS's first operand and A as its
//! second, each with its own transpose flag, and no copy is made.
//!
//! A plan (descriptors, layouts and the heuristic's algorithm) is made once per shape,
//! precision and pointer alignment and kept: cudarc's safe wrapper rebuilds them and reruns
//! the heuristic on every call.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

/// Plans kept at once; a dense model needs a few dozen.
const MAX_PLANS: usize = 1024;

/// What makes two products share a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GemmKey {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub batch: usize,
    pub bf16: bool,
    pub tf32: bool,
    /// Largest power of two (up to 256) dividing each of the A, B, C addresses: cuBLASLt
    /// picks kernels by alignment, and a window into a buffer may be less aligned.
    pub align: [u32; 3],
}

/// Owned cuBLASLt objects of one shape.
pub(crate) struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    // The cuBLAS operand order: `first` is our B, `second` our A.
    first: sys::cublasLtMatrixLayout_t,
    second: sys::cublasLtMatrixLayout_t,
    out: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once; errors on
        // teardown have no one to report to.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.first);
            let _ = lt::destroy_matrix_layout(self.second);
            let _ = lt::destroy_matrix_layout(self.out);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

pub(crate) fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

/// The cuBLASLt handle, its workspace and the plans made so far.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    pub workspace: cudarc::driver::CudaSlice<u8>,
    plans: HashMap<GemmKey, Plan>,
}

// SAFETY: cuBLASLt handles and descriptors may be used from any thread as long as calls
// do not overlap; the backend keeps `Lt` behind a Mutex, which serializes them.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created in `Lt::new` and is destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn err(what: &str, e: lt::CublasError) -> String {
    format!("cuBLASLt {what}: {e:?}")
}

fn layout(
    ty: sys::cudaDataType, rows: usize, cols: usize, ld: usize, batch: usize, stride: usize,
) -> Result<sys::cublasLtMatrixLayout_t, String> {
    let l =
        lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map_err(|e| err("layout", e))?;
    if batch > 1 {
        let count = batch as i32;
        let stride = stride as i64;
        // SAFETY: `l` is live; the values are plain integers of the attribute's type.
        unsafe {
            lt::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&count) as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(|e| err("batch count", e))?;
            lt::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride) as *const i64 as *const c_void,
                size_of::<i64>(),
            )
            .map_err(|e| err("batch stride", e))?;
        }
    }
    Ok(l)
}

impl Lt {
    pub fn new(workspace: cudarc::driver::CudaSlice<u8>) -> Result<Lt, String> {
        // cuBLASLt's structs change between major versions: bindings of one major driving a
        // library of another corrupt memory instead of failing, so refuse that pairing.
        let built = cudarc::driver::sys::CUDA_VERSION / 1000;
        // SAFETY: a version query with no arguments; it loads the library like any call.
        let loaded = unsafe { sys::cublasLtGetVersion() } / 10_000;
        if loaded as u32 != built {
            return Err(format!(
                "the cuBLASLt found is version {loaded} but this build has CUDA {built} bindings; \
                 build with rusting_brain's feature {} (or put CUDA {built}'s libcublasLt first on the loader path)",
                if loaded >= 13 { "cuda-13" } else { "cuda" }
            ));
        }
        let handle = lt::create_handle().map_err(|e| err("handle", e))?;
        Ok(Lt { handle, workspace, plans: HashMap::new() })
    }

    fn plan(&mut self, key: GemmKey) -> Result<&Plan, String> {
        if !self.plans.contains_key(&key) {
            // Mixture-of-experts products change shape every step (an expert's row count):
            // bound the cache rather than let it grow for the whole run.
            if self.plans.len() >= MAX_PLANS {
                self.plans.clear();
            }
            let plan = self.make_plan(&key)?;
            self.plans.insert(key, plan);
        }
        self.plans.get(&key).ok_or_else(|| "cuBLASLt plan vanished".to_string())
    }

    fn make_plan(&self, key: &GemmKey) -> Result<Plan, String> {
        let GemmKey { m, n, k, .. } = *key;
        let f32_ty = sys::cudaDataType_t::CUDA_R_32F;
        let in_ty = if key.bf16 { sys::cudaDataType_t::CUDA_R_16BF } else { f32_ty };
        let compute = if !key.bf16 && key.tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let desc = lt::create_matmul_desc(compute, f32_ty).map_err(|e| err("descriptor", e))?;
        // Our B, stored (k, n) row-major = column-major (n, k) with ld n, used as is; or
        // stored (n, k) = column-major (k, n) with ld k, transposed.
        let (b_rows, b_cols, ldb) = if key.trans_b { (k, n, k) } else { (n, k, n) };
        // Our A, stored (m, k) = column-major (k, m) with ld k, used as is; or stored
        // (k, m) = column-major (m, k) with ld m, transposed.
        let (a_rows, a_cols, lda) = if key.trans_a { (m, k, m) } else { (k, m, k) };
        let mut plan = Plan {
            desc,
            first: layout(in_ty, b_rows, b_cols, ldb, key.batch, k * n)?,
            second: layout(in_ty, a_rows, a_cols, lda, key.batch, m * k)?,
            out: layout(f32_ty, n, m, n, key.batch, m * n)?,
            // Filled below.
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let (ta, tb) = (key.trans_b as i32, key.trans_a as i32);
        // SAFETY: live descriptor; attribute values are i32 operation codes (0 = N, 1 = T).
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&ta) as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(|e| err("transpose", e))?;
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                (&tb) as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(|e| err("transpose", e))?;
        }
        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        let ws = self.workspace.len();
        let aligns = [key.align[1], key.align[0], key.align[2], key.align[2]];
        let attrs = [
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ];
        // SAFETY: live preference; values of the attributes' types (usize bytes, u32
        // alignments); the preference is destroyed on every path below.
        let heuristic = unsafe {
            let mut r = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                size_of::<usize>(),
            );
            for (attr, a) in attrs.iter().zip(aligns.iter()) {
                if r.is_ok() {
                    r = lt::set_matmul_pref_attribute(
                        pref,
                        *attr,
                        a as *const u32 as *const c_void,
                        size_of::<u32>(),
                    );
                }
            }
            let h = r.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    plan.desc,
                    plan.first,
                    plan.second,
                    plan.out,
                    plan.out,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            h.map_err(|e| err(&format!("found no algorithm for {key:?}"), e))?
        };
        // Assigned, not `Plan { algo, ..plan }`: the handles are Copy, so that form would
        // copy them out and drop `plan` here, destroying what the new value points to.
        plan.algo = heuristic.algo;
        Ok(plan)
    }

    /// `C = alpha op(A) op(B) + beta C` on `stream`, with device addresses already offset
    /// to the operands (A and B in bf16 when `key.bf16`).
    ///
    /// # Safety
    /// The addresses must hold the operands `key` describes, on this handle's device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &mut self, key: GemmKey, a: u64, b: u64, c: u64, alpha: f32, beta: f32, workspace: u64,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), String> {
        let ws = self.workspace.len();
        let handle = self.handle;
        let plan = self.plan(key)?;
        lt::matmul(
            handle,
            plan.desc,
            (&alpha) as *const f32 as *const c_void,
            (&beta) as *const f32 as *const c_void,
            b as *const c_void,
            plan.first,
            a as *const c_void,
            plan.second,
            c as *const c_void,
            plan.out,
            c as *mut c_void,
            plan.out,
            &plan.algo,
            workspace as *mut c_void,
            ws,
            stream as _,
        )
        .map_err(|e| err(&format!("matmul {key:?}"), e))
    }
}
