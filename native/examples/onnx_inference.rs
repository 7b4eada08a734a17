//! Run an ONNX model (feature `onnx`, through tract): prints its inputs and outputs, then
//! runs it.
//!
//!     cargo run --example onnx_inference --features onnx -- model.onnx
//!     cargo run --example onnx_inference --features onnx -- xor.onnx 1,2 0,1
//!
//! With only a path, every input must have a fixed shape (the model runs on zeros);
//! otherwise give each input's shape and its values, comma-separated, in the model's input
//! order: `SHAPE VALUES [SHAPE VALUES ...]`. Exports with a dynamic batch (PyTorch's
//! `dynamic_shapes`, tf2onnx's `None`) need the shape.

type Error = Box<dyn std::error::Error>;

fn list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>, Error> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse::<T>().map_err(|_| format!("{what} `{s}`: `{p}` is not a number").into()))
        .collect()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: onnx_inference MODEL.onnx [SHAPE VALUES ...] (e.g. xor.onnx 1,2 0,1)".into());
    };
    let mut model = rusting_brain::OnnxModel::load(path)?;
    println!("{path}");
    for io in model.input_shapes() {
        println!("  input  {io}");
    }
    for io in model.output_shapes() {
        println!("  output {io}");
    }
    let rest = &args[1..];
    let inputs: Vec<(Vec<usize>, Vec<f32>)> = if rest.is_empty() {
        let shapes = model.fixed_input_shapes().ok_or_else(|| {
            let dynamic: Vec<String> = model.input_shapes().iter().map(ToString::to_string).collect();
            // An example call: each dynamic dimension at 1, the values zeros.
            let example: Vec<String> = model
                .input_shapes()
                .iter()
                .map(|io| {
                    let dims: Vec<usize> = io
                        .shape
                        .iter()
                        .flatten()
                        .map(|d| match d {
                            rusting_brain::OnnxDim::Fixed(n) => *n,
                            rusting_brain::OnnxDim::Symbolic(_) => 1,
                        })
                        .collect();
                    let n: usize = dims.iter().product();
                    let d: Vec<String> = dims.iter().map(ToString::to_string).collect();
                    format!("{} {}", d.join(","), vec!["0"; n].join(","))
                })
                .collect();
            format!(
                "the inputs have dynamic dimensions ({}): give each input's shape and values, e.g. `{path} {}`",
                dynamic.join("; "),
                example.join(" ")
            )
        })?;
        println!("running on zeros");
        shapes
            .into_iter()
            .map(|s| {
                let n = s.iter().product();
                (s, vec![0.0; n])
            })
            .collect()
    } else {
        if !rest.len().is_multiple_of(2) {
            return Err("give a shape and its values for each input: SHAPE VALUES [SHAPE VALUES ...]".into());
        }
        rest.chunks(2)
            .map(|p| Ok((list(&p[0], "shape")?, list(&p[1], "values")?)))
            .collect::<Result<_, Error>>()?
    };
    let refs: Vec<(&[usize], &[f32])> = inputs.iter().map(|(s, v)| (s.as_slice(), v.as_slice())).collect();
    for out in model.run(&refs)? {
        let shown: Vec<String> = out.values.iter().take(16).map(|v| format!("{v:.6}")).collect();
        let more = if out.values.len() > 16 { ", ..." } else { "" };
        println!("{} {:?}: [{}{more}]", out.name, out.shape, shown.join(", "));
    }
    Ok(())
}
