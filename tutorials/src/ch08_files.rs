//! Chapter 8: files. A trained network saved as JSON and loaded back exactly; what a
//! damaged, newer or unwritable file gives; and the same network as ONNX, whose protobuf
//! structure the program reads back with a small decoder of its own.

// ANCHOR: uses
use std::path::Path;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
// ANCHOR_END: uses

// ANCHOR: train
/// Three clouds of points in three dimensions, one per class, and a network that has
/// learned to tell them apart.
fn trained() -> Result<(Network, Dataset)> {
    let mut rng = Rng::new(8);
    let centers = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for i in 0..150 {
        let class = i % 3;
        inputs.push(centers[class].iter().map(|c| (c + 0.3 * rng.normal()) as f32).collect());
        let mut target = vec![0.0; 3];
        target[class] = 1.0;
        targets.push(target);
    }
    let data = Dataset::new(inputs, targets)?;
    let mut network = Network::builder()
        .input_size(3)
        .dense(8, Activation::Relu)
        .dense(3, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.02))
        .seed(8)
        .try_build()?;
    network.fit(&data, TrainConfig { epochs: 30, batch_size: 16, shuffle: true, seed: Some(8) })?;
    Ok((network, data))
}
// ANCHOR_END: train

// ANCHOR: json
fn json_round_trip(network: &mut Network, data: &Dataset, dir: &Path) -> Result<()> {
    let path = dir.join("network.json");
    network.save_json(&path)?;
    let text = std::fs::read_to_string(&path)?;
    println!("network.json: {} bytes, beginning", text.len());
    text.lines().take(5).for_each(|line| println!("    {line}"));

    // Every output of the loaded network equals the original's to the last bit, and so
    // does the file it writes.
    let mut loaded = Network::load_json(&path)?;
    let (before, after) = (network.predict_batch(data.inputs())?, loaded.predict_batch(data.inputs())?);
    let identical = before.len() == after.len()
        && before.iter().flatten().zip(after.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits());
    loaded.save_json(dir.join("again.json"))?;
    let same_file = std::fs::read(&path)? == std::fs::read(dir.join("again.json"))?;
    println!("loaded: {} predictions bit-identical {identical}, file identical {same_file}", before.len());
    assert!(identical && same_file);
    assert_eq!(loaded.accuracy(data)?, network.accuracy(data)?);
    Ok(())
}
// ANCHOR_END: json

// ANCHOR: resume
/// The file holds the optimizer's settings, not its state: a loaded network restarts
/// Adam's moving averages from zero, so one more epoch moves it differently.
fn one_more_epoch(network: &mut Network, data: &Dataset, dir: &Path) -> Result<bool> {
    let mut loaded = Network::load_json(dir.join("network.json"))?;
    let epoch = TrainConfig { epochs: 1, batch_size: 16, shuffle: true, seed: Some(9) };
    network.fit(data, epoch)?;
    loaded.fit(data, epoch)?;
    network.save_json(dir.join("continued.json"))?;
    loaded.save_json(dir.join("reloaded.json"))?;
    let same = std::fs::read(dir.join("continued.json"))? == std::fs::read(dir.join("reloaded.json"))?;
    println!("one more epoch: continued and reloaded weights identical {same}");
    Ok(same)
}
// ANCHOR_END: resume

// ANCHOR: errors
fn bad_files(dir: &Path) -> Result<Vec<String>> {
    let good = std::fs::read_to_string(dir.join("network.json"))?;
    let cases = [
        ("truncated.json", good[..good.len() / 2].to_string()),
        ("newer.json", good.replacen("\"version\": 1", "\"version\": 2", 1)),
        ("no_format.json", good.replacen("rusting_brain.network", "something.else", 1)),
    ];
    let mut messages = Vec::new();
    for (name, text) in cases {
        std::fs::write(dir.join(name), text)?;
        let error = Network::load_json(dir.join(name)).err().ok_or("a damaged file loaded")?;
        println!("{name}: {error}");
        messages.push(error.to_string());
    }
    // Saving into a folder that does not exist: the error names the path, and nothing
    // half-written is left behind.
    let nowhere = dir.join("missing").join("network.json");
    let error =
        Network::load_json(dir.join("network.json"))?.save_json(&nowhere).err().ok_or("saved nowhere")?;
    println!("save into a missing folder: {error}");
    messages.push(error.to_string());
    Ok(messages)
}
// ANCHOR_END: errors

// ANCHOR: protobuf
/// One field of a protobuf message: a number (varint) or bytes (a length-delimited string,
/// bytes or sub-message, or a fixed-size 4- or 8-byte value).
enum Field<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

/// A base-128 varint: seven bits a byte, low bits first, the top bit set on all but the last.
fn varint(bytes: &[u8], at: &mut usize) -> Result<u64> {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or("the message ends inside a varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint longer than ten bytes".into())
}

/// Every (field number, value) of a message, in order. Each field starts with a varint
/// key: the field number times 8, plus the wire type in the low three bits.
fn fields(bytes: &[u8]) -> Result<Vec<(u64, Field<'_>)>> {
    let (mut out, mut at) = (Vec::new(), 0);
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let len = match key & 7 {
            0 => {
                out.push((key >> 3, Field::Int(varint(bytes, &mut at)?)));
                continue;
            }
            1 => 8,
            2 => usize::try_from(varint(bytes, &mut at)?)?,
            5 => 4,
            other => return Err(format!("wire type {other} is not used by ONNX").into()),
        };
        let end = at.checked_add(len).filter(|&end| end <= bytes.len()).ok_or("a field runs past the end")?;
        out.push((key >> 3, Field::Bytes(&bytes[at..end])));
        at = end;
    }
    Ok(out)
}

/// The values of field `number` that are bytes (strings, sub-messages).
fn all_bytes(bytes: &[u8], number: u64) -> Result<Vec<&[u8]>> {
    let values = fields(bytes)?.into_iter().filter_map(|(n, field)| match field {
        Field::Bytes(b) if n == number => Some(b),
        _ => None,
    });
    Ok(values.collect())
}

fn first_bytes(bytes: &[u8], number: u64) -> Result<&[u8]> {
    let first = all_bytes(bytes, number)?.first().copied();
    first.ok_or_else(|| format!("no field {number}").into())
}

fn text(bytes: &[u8], number: u64) -> Result<String> {
    Ok(String::from_utf8(first_bytes(bytes, number)?.to_vec())?)
}

/// The integers of field `number`: one per field, or several packed into one bytes field.
fn ints(bytes: &[u8], number: u64) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for (n, field) in fields(bytes)? {
        match field {
            Field::Int(v) if n == number => out.push(v),
            Field::Bytes(packed) if n == number => {
                let mut at = 0;
                while at < packed.len() {
                    out.push(varint(packed, &mut at)?);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
// ANCHOR_END: protobuf

// ANCHOR: onnx
/// A tensor's shape from a graph input or output (`ValueInfoProto`): each dimension is a
/// number (field 1) or a symbolic name (field 2).
fn shape(value_info: &[u8]) -> Result<Vec<String>> {
    let tensor_type = first_bytes(first_bytes(value_info, 2)?, 1)?;
    let mut dims = Vec::new();
    for dim in all_bytes(first_bytes(tensor_type, 2)?, 1)? {
        dims.push(match fields(dim)?.first() {
            Some((1, Field::Int(v))) => v.to_string(),
            Some((2, Field::Bytes(name))) => String::from_utf8(name.to_vec())?,
            _ => return Err("a dimension with neither a size nor a name".into()),
        });
    }
    Ok(dims)
}

fn read_onnx(network: &Network, dir: &Path) -> Result<()> {
    let path = dir.join("network.onnx");
    network.save_onnx(&path)?;
    let bytes = std::fs::read(&path)?;

    // ModelProto: field 8 the opset imports (each with its version in field 2), field 7 the graph.
    let opset = ints(first_bytes(&bytes, 8)?, 2)?;
    let graph = first_bytes(&bytes, 7)?;
    // GraphProto: field 1 the nodes (op_type in field 4), 11 the inputs, 12 the outputs,
    // 5 the initializers (name in field 8, dims in 1, little-endian floats in 9).
    let ops: Vec<String> =
        all_bytes(graph, 1)?.into_iter().map(|node| text(node, 4)).collect::<Result<_>>()?;
    let (input, output) = (shape(first_bytes(graph, 11)?)?, shape(first_bytes(graph, 12)?)?);
    println!("network.onnx: {} bytes, opset {opset:?}, nodes {ops:?}", bytes.len());
    println!("input {input:?} -> output {output:?}");
    assert_eq!(opset, [13]);
    assert_eq!(ops, ["Gemm", "Relu", "Gemm", "Softmax"]);
    assert_eq!(
        (input, output),
        (vec!["batch".to_string(), "3".into()], vec!["batch".to_string(), "3".into()])
    );

    // The first layer's weights, as the ONNX file stores them and as the JSON file does.
    let weights = all_bytes(graph, 5)?.into_iter().find(|t| text(t, 8).is_ok_and(|n| n == "layer0.weight"));
    let weights = weights.ok_or("no layer0.weight initializer")?;
    let onnx_values: Vec<f32> = first_bytes(weights, 9)?
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("network.json"))?)?;
    let json_values: Vec<f32> =
        serde_json::from_value::<Vec<Vec<f32>>>(json["layers"][0]["weights"].clone())?.concat();
    println!(
        "layer0.weight: dims {:?}, equal to the JSON file's {}",
        ints(weights, 1)?,
        onnx_values == json_values
    );
    assert_eq!(ints(weights, 1)?, [8, 3]);
    assert_eq!(onnx_values, json_values);
    Ok(())
}
// ANCHOR_END: onnx

// ANCHOR: main
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_08");
    std::fs::create_dir_all(&dir)?;
    let (mut network, data) = trained()?;
    let accuracy = network.accuracy(&data)?;
    println!("training accuracy {:.1}%", 100.0 * accuracy);
    assert!(accuracy > 0.95);

    json_round_trip(&mut network, &data, &dir)?;
    read_onnx(&network, &dir)?;

    let messages = bad_files(&dir)?;
    assert!(messages[0].contains("truncated.json") && messages[0].contains("line"));
    assert!(messages[1].contains("newer.json: version: written by a newer rusting_brain"));
    assert!(messages[2].contains("not a rusting_brain network file"));
    assert!(messages[3].contains("missing"));
    // Every save wrote a temporary file beside its target and renamed it over the target;
    // none is left behind, not even by the save that failed.
    let leftovers = std::fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().contains(".tmp"))
        .count();
    assert_eq!(leftovers, 0);

    assert!(!one_more_epoch(&mut network, &data, &dir)?, "Adam's state is not in the file");
    Ok(())
}
// ANCHOR_END: main
