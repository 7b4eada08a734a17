//! `Network::save_onnx`: a dense network as an ONNX graph at opset 13. Per layer, a `Gemm`
//! (`transB = 1`: the weights stay `(out, in)`, PyTorch's `nn.Linear` layout) and the
//! activation's node; one symbolic batch dimension, `batch`; weights and biases as
//! initializers. The protobuf messages below are the subset of `onnx.proto` this writes,
//! as prost structs carrying that file's field numbers.

use std::path::Path;

use prost::Message;
use rusting_brain_core::Activation;

use crate::{Network, Result};

/// The opset the graph is written for, and the IR version that opset needs.
pub const OPSET: i64 = 13;
const IR_VERSION: i64 = 7;
/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;

pub(crate) mod proto {
    //! `onnx.proto` (proto2), the messages and fields a dense graph needs.

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ModelProto {
        #[prost(int64, optional, tag = "1")]
        pub ir_version: Option<i64>,
        #[prost(message, repeated, tag = "8")]
        pub opset_import: Vec<OperatorSetIdProto>,
        #[prost(string, optional, tag = "2")]
        pub producer_name: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub producer_version: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub doc_string: Option<String>,
        #[prost(message, optional, tag = "7")]
        pub graph: Option<GraphProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OperatorSetIdProto {
        #[prost(string, optional, tag = "1")]
        pub domain: Option<String>,
        #[prost(int64, optional, tag = "2")]
        pub version: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GraphProto {
        #[prost(message, repeated, tag = "1")]
        pub node: Vec<NodeProto>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(message, repeated, tag = "5")]
        pub initializer: Vec<TensorProto>,
        #[prost(message, repeated, tag = "11")]
        pub input: Vec<ValueInfoProto>,
        #[prost(message, repeated, tag = "12")]
        pub output: Vec<ValueInfoProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeProto {
        #[prost(string, repeated, tag = "1")]
        pub input: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub output: Vec<String>,
        #[prost(string, optional, tag = "3")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub op_type: Option<String>,
        #[prost(message, repeated, tag = "5")]
        pub attribute: Vec<AttributeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        /// `AttributeType`: FLOAT = 1, INT = 2.
        #[prost(int32, optional, tag = "20")]
        pub r#type: Option<i32>,
        #[prost(float, optional, tag = "2")]
        pub f: Option<f32>,
        #[prost(int64, optional, tag = "3")]
        pub i: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorProto {
        #[prost(int64, repeated, tag = "1")]
        pub dims: Vec<i64>,
        #[prost(int32, optional, tag = "2")]
        pub data_type: Option<i32>,
        #[prost(string, optional, tag = "8")]
        pub name: Option<String>,
        /// Little-endian values.
        #[prost(bytes = "vec", optional, tag = "9")]
        pub raw_data: Option<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueInfoProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(message, optional, tag = "2")]
        pub r#type: Option<TypeProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeProto {
        #[prost(oneof = "type_proto::Value", tags = "1")]
        pub value: Option<type_proto::Value>,
    }

    pub mod type_proto {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(message, tag = "1")]
            TensorType(Tensor),
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Tensor {
            #[prost(int32, optional, tag = "1")]
            pub elem_type: Option<i32>,
            #[prost(message, optional, tag = "2")]
            pub shape: Option<super::TensorShapeProto>,
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TensorShapeProto {
        #[prost(message, repeated, tag = "1")]
        pub dim: Vec<Dimension>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
    }

    pub mod dimension {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(int64, tag = "1")]
            DimValue(i64),
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

use proto::*;

/// A `(batch, width)` f32 tensor's description.
fn batch_by(name: &str, width: usize) -> ValueInfoProto {
    let dim = |v| Dimension { value: Some(v) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(FLOAT),
                shape: Some(TensorShapeProto {
                    dim: vec![
                        dim(dimension::Value::DimParam("batch".into())),
                        dim(dimension::Value::DimValue(width as i64)),
                    ],
                }),
            })),
        }),
    }
}

fn tensor(name: String, dims: &[usize], values: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(FLOAT),
        name: Some(name),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

fn node(
    op: &str, name: String, input: Vec<String>, output: String, attribute: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto { input, output: vec![output], name: Some(name), op_type: Some(op.into()), attribute }
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(2), i: Some(i), ..Default::default() }
}

fn float_attr(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(1), f: Some(f), ..Default::default() }
}

/// The model's bytes: `input (batch, inputs)` through every layer to `output (batch, units)`.
pub(crate) fn encode(network: &Network) -> Result<Vec<u8>> {
    let model = network.model()?;
    let config = model.config();
    let params = model.parameters()?;
    let mut nodes = Vec::new();
    let mut initializer = Vec::new();
    let mut x = "input".to_string();
    let last = config.layers.len() - 1;
    for (l, ((w, b), layer)) in params.iter().zip(&config.layers).enumerate() {
        let (fan_in, units) = config.fan(l);
        let (wn, bn) = (format!("layer{l}.weight"), format!("layer{l}.bias"));
        initializer.push(tensor(wn.clone(), &[units, fan_in], w));
        initializer.push(tensor(bn.clone(), &[units], b));
        let activation = match layer.activation {
            Activation::Identity => None,
            Activation::Relu => Some(("Relu", vec![])),
            Activation::LeakyRelu(a) => Some(("LeakyRelu", vec![float_attr("alpha", a)])),
            Activation::Sigmoid => Some(("Sigmoid", vec![])),
            Activation::Tanh => Some(("Tanh", vec![])),
            Activation::Softmax => Some(("Softmax", vec![int_attr("axis", 1)])),
        };
        let out = |what: &str| {
            if l == last {
                "output".to_string()
            } else {
                format!("layer{l}.{what}")
            }
        };
        // z = x W^T + b
        let z = if activation.is_some() { format!("layer{l}.z") } else { out("y") };
        nodes.push(node(
            "Gemm",
            format!("layer{l}.gemm"),
            vec![x, wn, bn],
            z.clone(),
            vec![int_attr("transB", 1)],
        ));
        x = match activation {
            Some((op, attrs)) => {
                let y = out("y");
                nodes.push(node(op, format!("layer{l}.{}", op.to_lowercase()), vec![z], y.clone(), attrs));
                y
            }
            None => z,
        };
    }
    let (inputs, outputs) = (config.input_size, config.layers[last].units);
    let m = ModelProto {
        ir_version: Some(IR_VERSION),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(OPSET) }],
        producer_name: Some("rusting_brain".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        doc_string: Some(format!(
            "dense network, {} layers, trained with rusting_brain",
            config.layers.len()
        )),
        graph: Some(GraphProto {
            node: nodes,
            name: Some("rusting_brain_network".into()),
            initializer,
            input: vec![batch_by("input", inputs)],
            output: vec![batch_by("output", outputs)],
        }),
    };
    Ok(m.encode_to_vec())
}

/// Writes [`encode`]'s bytes atomically.
pub(crate) fn save(network: &Network, path: &Path) -> Result<()> {
    let bytes = encode(network)?;
    crate::io::files::write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Loss, Network};

    /// The graph as written, decoded back: nodes, attributes, initializer shapes, the
    /// symbolic batch. (Running it is native/tests/onnx.rs's job, under feature `onnx`.)
    #[test]
    fn the_graph_reads_back_as_written() {
        let net = Network::builder()
            .input_size(3)
            .dense(5, Activation::LeakyRelu(0.2))
            .dense(4, Activation::Identity)
            .dense(2, Activation::Softmax)
            .loss(Loss::CategoricalCrossEntropy)
            .seed(1)
            .build();
        let m = ModelProto::decode(encode(&net).unwrap().as_slice()).unwrap();
        assert_eq!(m.ir_version, Some(7));
        assert_eq!(m.opset_import[0].version, Some(13));
        let g = m.graph.unwrap();
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_deref().unwrap()).collect();
        assert_eq!(ops, ["Gemm", "LeakyRelu", "Gemm", "Gemm", "Softmax"]);
        assert_eq!(g.node[0].attribute[0].name.as_deref(), Some("transB"));
        assert_eq!(g.node[1].attribute[0].f, Some(0.2));
        assert_eq!(g.node[4].input, ["layer2.z"]);
        assert_eq!(g.node.last().unwrap().output, ["output"]);
        let dims: Vec<Vec<i64>> = g.initializer.iter().map(|t| t.dims.clone()).collect();
        assert_eq!(dims, [vec![5, 3], vec![5], vec![4, 5], vec![4], vec![2, 4], vec![2]]);
        let first = &net.model().unwrap().parameters().unwrap()[0].0;
        let raw: Vec<u8> = first.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(g.initializer[0].raw_data.as_deref(), Some(&raw[..]));
        let Some(type_proto::Value::TensorType(t)) = &g.input[0].r#type.as_ref().unwrap().value else {
            panic!("input type")
        };
        let shape = &t.shape.as_ref().unwrap().dim;
        assert_eq!(shape[0].value, Some(dimension::Value::DimParam("batch".into())));
        assert_eq!(shape[1].value, Some(dimension::Value::DimValue(3)));
    }
}
