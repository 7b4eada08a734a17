//! ONNX inference (feature `onnx`) through tract, a maintained ONNX runtime in Rust: this
//! module reads the file, reports its inputs and outputs, fixes dynamic dimensions from the
//! shapes a call gives, and keeps one optimized plan per set of input shapes.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::infer::Factoid;

use crate::{NetworkError, Result};

/// One dimension of an input or output: a size, or a name the file leaves open (`batch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnnxDim {
    /// A size the file fixes.
    Fixed(usize),
    /// A size named but left open, given at run time.
    Symbolic(String),
}

impl fmt::Display for OnnxDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnnxDim::Fixed(n) => write!(f, "{n}"),
            OnnxDim::Symbolic(s) => write!(f, "{s}"),
        }
    }
}

/// An input or output: its name and shape (`None` where the file does not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxIo {
    /// The name the graph gives it.
    pub name: String,
    /// Its dimensions, where the file says.
    pub shape: Option<Vec<OnnxDim>>,
}

impl fmt::Display for OnnxIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.shape {
            Some(dims) => {
                let d: Vec<String> = dims.iter().map(ToString::to_string).collect();
                write!(f, "{} [{}]", self.name, d.join(", "))
            }
            None => write!(f, "{} [unknown shape]", self.name),
        }
    }
}

/// An output of [`OnnxModel::run`]: its shape and values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxOutput {
    /// The output's name in the graph.
    pub name: String,
    /// Its dimensions.
    pub shape: Vec<usize>,
    /// `shape`'s product of values, row-major.
    pub values: Vec<f32>,
}

type Plan = Arc<TypedRunnableModel>;

/// An ONNX model read with [`OnnxModel::load`] (PyTorch's `torch.onnx.export`,
/// TensorFlow/Keras through `tf2onnx`, [`crate::Network::save_onnx`]).
pub struct OnnxModel {
    path: PathBuf,
    model: InferenceModel,
    inputs: Vec<OnnxIo>,
    outputs: Vec<OnnxIo>,
    plans: HashMap<Vec<Vec<usize>>, Plan>,
}

fn err(path: &Path, what: &str, e: impl fmt::Display) -> NetworkError {
    // tract's error chain (`{:#}`: every context, no backtrace) names the node and the
    // operator that failed.
    NetworkError::InvalidInput(format!("{}: {what}: {e:#}", path.display()))
}

/// Runs a call into tract, turning a panic into an error naming the file. tract asserts
/// some invariants of a graph (a name it looks up, an axis in range) with panics instead
/// of errors; the fuzz target `fuzz/fuzz_targets/onnx.rs` found two. A malformed file is
/// the caller's error to handle, never a crash.
fn guarded<T>(path: &Path, what: &str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        NetworkError::InvalidInput(format!(
            "{}: {what}: a malformed ONNX graph (tract stopped on it: {why})",
            path.display()
        ))
    })
}

/// Every value a node reads and every graph output must be defined by the graph (an input,
/// an initializer or a node's output): tract looks names up without checking. A file the
/// subset of `onnx.proto` here cannot decode is left to tract's own error.
fn check_names(bytes: &[u8], path: &Path) -> Result<()> {
    use prost::Message;
    let Ok(model) = crate::dense::onnx_export::proto::ModelProto::decode(bytes) else {
        return Ok(());
    };
    let Some(g) = model.graph else { return Ok(()) };
    let mut defined: std::collections::HashSet<&str> =
        g.input.iter().filter_map(|v| v.name.as_deref()).collect();
    defined.extend(g.initializer.iter().filter_map(|t| t.name.as_deref()));
    defined.extend(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)));
    let bad = |what: String| Err(NetworkError::parse(path, "graph", what));
    for n in &g.node {
        if let Some(missing) = n.input.iter().find(|i| !i.is_empty() && !defined.contains(i.as_str())) {
            return bad(format!(
                "node `{}` reads `{missing}`, which no input, initializer or node of the graph defines",
                n.name.as_deref().unwrap_or("")
            ));
        }
    }
    for o in &g.output {
        let name = o.name.as_deref().unwrap_or("");
        if !defined.contains(name) {
            return bad(format!(
                "the graph's output `{name}` is not an input, an initializer or any node's output"
            ));
        }
    }
    Ok(())
}

fn describe(fact: &InferenceFact) -> Option<Vec<OnnxDim>> {
    if fact.shape.is_open() {
        return None;
    }
    Some(
        fact.shape
            .dims()
            .map(|d| match d.concretize() {
                Some(t) => match t.to_i64().map(|v| v as usize) {
                    Ok(n) => OnnxDim::Fixed(n),
                    Err(_) => OnnxDim::Symbolic(t.to_string()),
                },
                None => OnnxDim::Symbolic("?".into()),
            })
            .collect(),
    )
}

impl OnnxModel {
    /// Reads an ONNX file. An operator tract does not implement, a file that is not ONNX or
    /// is cut short, is an error naming the file (and the node and operator).
    pub fn load(path: impl AsRef<Path>) -> Result<OnnxModel> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(NetworkError::InvalidInput(format!("{}: no such ONNX file", path.display())));
        }
        let bytes = crate::io::files::read(path)?;
        check_names(&bytes, path)?;
        let parsed =
            guarded(path, "reading the graph", || tract_onnx::onnx().model_for_read(&mut &bytes[..]))?;
        let model = parsed.map_err(|e| err(path, "not an ONNX model tract can read", e))?;
        // tract stands an operator it lacks in as a placeholder that fails only when run:
        // say so now, naming the node and the operator.
        if let Some(node) = model.nodes.iter().find(|n| n.op.name().starts_with("Unimplemented(")) {
            let op = node.op.name();
            let op = op.trim_start_matches("Unimplemented(").trim_end_matches(')');
            return Err(NetworkError::InvalidInput(format!(
                "{}: node `{}` is the operator {op}, which tract (the ONNX runtime behind feature `onnx`) does not implement",
                path.display(),
                node.name
            )));
        }
        // The outputs' shapes as tract infers them from the inputs' (symbolic where those
        // are); exporters often leave the file's own output shapes out.
        let typed = guarded(path, "inferring the output shapes", || model.clone().into_typed())?.ok();
        let io = |outlets: &[OutletId], fact: &dyn Fn(usize) -> TractResult<InferenceFact>| {
            outlets
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    Ok(OnnxIo {
                        // The graph's name for the value (a node is named apart from it).
                        name: model
                            .outlet_label(*o)
                            .map(str::to_string)
                            .unwrap_or_else(|| model.node(o.node).name.clone()),
                        shape: describe(&fact(i)?),
                    })
                })
                .collect::<TractResult<Vec<_>>>()
        };
        let inputs =
            io(model.input_outlets().map_err(|e| err(path, "inputs", e))?, &|i| model.input_fact(i).cloned())
                .map_err(|e| err(path, "inputs", e))?;
        let outputs = io(model.output_outlets().map_err(|e| err(path, "outputs", e))?, &|i| match typed
            .as_ref()
            .and_then(|t| t.output_fact(i).ok())
        {
            Some(f) => Ok(InferenceFact::from(f.clone())),
            None => model.output_fact(i).cloned(),
        })
        .map_err(|e| err(path, "outputs", e))?;
        Ok(OnnxModel { path: path.to_path_buf(), model, inputs, outputs, plans: HashMap::new() })
    }

    /// The inputs, in order, with the shapes the file gives (symbolic dimensions by name).
    pub fn input_shapes(&self) -> &[OnnxIo] {
        &self.inputs
    }

    /// The outputs, in order, as the file gives them.
    pub fn output_shapes(&self) -> &[OnnxIo] {
        &self.outputs
    }

    /// The input shapes with every dimension fixed, when the file fixes them all (a model
    /// that runs on zeros without being told a shape).
    pub fn fixed_input_shapes(&self) -> Option<Vec<Vec<usize>>> {
        self.inputs
            .iter()
            .map(|io| {
                io.shape
                    .as_ref()?
                    .iter()
                    .map(|d| match d {
                        OnnxDim::Fixed(n) => Some(*n),
                        OnnxDim::Symbolic(_) => None,
                    })
                    .collect()
            })
            .collect()
    }

    /// Runs the model on f32 inputs, `(shape, values)` each, in the order of
    /// [`OnnxModel::input_shapes`]. Dynamic dimensions take the given sizes; the first run
    /// at a set of shapes optimizes the model for them, later runs reuse that plan. A count,
    /// rank, size or value-count mismatch is an error before anything runs.
    pub fn run(&mut self, inputs: &[(&[usize], &[f32])]) -> Result<Vec<OnnxOutput>> {
        let bad = |m: String| NetworkError::InvalidInput(format!("{}: {m}", self.path.display()));
        if inputs.len() != self.inputs.len() {
            return Err(bad(format!(
                "the model takes {} inputs ({}); {} given",
                self.inputs.len(),
                self.inputs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                inputs.len()
            )));
        }
        for ((shape, values), io) in inputs.iter().zip(&self.inputs) {
            let n: usize = shape.iter().product();
            if n != values.len() {
                return Err(bad(format!(
                    "input {}: shape {shape:?} holds {n} values; {} given",
                    io.name,
                    values.len()
                )));
            }
            if let Some(dims) = &io.shape {
                if dims.len() != shape.len() {
                    return Err(bad(format!("input {io} has rank {}; shape {shape:?} given", dims.len())));
                }
                for (d, &s) in dims.iter().zip(shape.iter()) {
                    if let OnnxDim::Fixed(want) = d {
                        if *want != s {
                            return Err(bad(format!("input {io}: shape {shape:?} given")));
                        }
                    }
                }
            }
        }
        let key: Vec<Vec<usize>> = inputs.iter().map(|(s, _)| s.to_vec()).collect();
        let plan = match self.plans.get(&key) {
            Some(p) => p.clone(),
            None => {
                let mut m = self.model.clone();
                // The file's shapes of everything past the inputs (outputs, exporters'
                // value_info) carry the symbolic dimensions the inputs now fix; tract infers
                // them again from the inputs. Constants keep their values.
                let sources: Vec<usize> = m.inputs.iter().map(|o| o.node).collect();
                for node in m.nodes.iter_mut().filter(|n| !sources.contains(&n.id)) {
                    for outlet in node.outputs.iter_mut() {
                        if outlet.fact.value.concretize().is_none() {
                            outlet.fact = InferenceFact::default();
                        }
                    }
                }
                for (i, shape) in key.iter().enumerate() {
                    m.set_input_fact(i, f32::fact(shape).into())
                        .map_err(|e| err(&self.path, "fixing the input shapes", e))?;
                }
                let what = format!("preparing the model for input shapes {key:?}");
                let plan = guarded(&self.path, &what, || m.into_optimized().and_then(|m| m.into_runnable()))?
                    .map_err(|e| {
                        err(&self.path, &format!("preparing the model for input shapes {key:?}"), e)
                    })?;
                self.plans.insert(key.clone(), plan.clone());
                plan
            }
        };
        let tensors: TVec<TValue> = inputs
            .iter()
            .map(|(s, v)| Tensor::from_shape(s, v).map(|t| t.into()))
            .collect::<TractResult<_>>()
            .map_err(|e| err(&self.path, "inputs", e))?;
        let out = guarded(&self.path, "running", || plan.run(tensors))?
            .map_err(|e| err(&self.path, "running", e))?;
        out.iter()
            .zip(&self.outputs)
            .map(|(t, io)| {
                let t = t.cast_to::<f32>().map_err(|e| err(&self.path, &format!("output {}", io.name), e))?;
                let values: Vec<f32> = t
                    .to_plain_array_view::<f32>()
                    .map_err(|e| err(&self.path, &format!("output {}", io.name), e))?
                    .iter()
                    .copied()
                    .collect();
                Ok(OnnxOutput { name: io.name.clone(), shape: t.shape().to_vec(), values })
            })
            .collect()
    }
}
