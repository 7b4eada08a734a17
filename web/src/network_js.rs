//! The JS `Network`: a dense network built from a plain object (the package's
//! `NetworkBuilder` writes it), trained with `fit`, asked with `predict`, `evaluate` and
//! `accuracy`, and written and read as native `save_json`'s file. Bad input from JS (wrong
//! widths, NaN, unknown names, wrong types) is an `Error` naming what to change.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Float32Array, Float64Array, Function, Object, Reflect};
use rusting_brain_core::models::dense::{DenseConfig, DenseLayer, EpochOrder};
use rusting_brain_core::models::dense_file::{self, parse_activation, parse_loss, DenseFile};
use rusting_brain_core::Optimizer;
use wasm_bindgen::prelude::*;

use crate::engine::DeviceChoice;
use crate::network::{DenseNet, Rows};
use crate::{js_err, next_turn, set, WebError};

fn invalid(message: impl Into<String>) -> WebError {
    WebError::Invalid(message.into())
}

pub(crate) fn field(obj: &JsValue, key: &str) -> Result<Option<JsValue>, WebError> {
    if obj.is_undefined() || obj.is_null() {
        return Ok(None);
    }
    if !obj.is_object() {
        return Err(invalid(format!("expected an object holding `{key}`")));
    }
    let v = Reflect::get(obj, &key.into()).map_err(|_| invalid(format!("`{key}` cannot be read")))?;
    Ok(if v.is_undefined() || v.is_null() { None } else { Some(v) })
}

pub(crate) fn number(obj: &JsValue, key: &str, what: &str) -> Result<Option<f64>, WebError> {
    match field(obj, key)? {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(invalid(format!("{what}.{key} must be a finite number"))),
        },
    }
}

/// A whole number in `0..=max`.
pub(crate) fn count(obj: &JsValue, key: &str, what: &str, max: f64) -> Result<Option<u64>, WebError> {
    match number(obj, key, what)? {
        None => Ok(None),
        Some(x) if x >= 0.0 && x <= max && x.fract() == 0.0 => Ok(Some(x as u64)),
        Some(x) => Err(invalid(format!("{what}.{key} is {x}; expected a whole number from 0 to {max}"))),
    }
}

pub(crate) fn text(obj: &JsValue, key: &str, what: &str) -> Result<Option<String>, WebError> {
    match field(obj, key)? {
        None => Ok(None),
        Some(v) => v.as_string().map(Some).ok_or_else(|| invalid(format!("{what}.{key} must be a string"))),
    }
}

/// The largest integer a JS number holds exactly.
const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

fn optimizer_of(spec: &JsValue) -> Result<Optimizer, WebError> {
    let Some(o) = field(spec, "optimizer")? else {
        return Ok(Optimizer::adam(1e-3));
    };
    let what = "optimizer";
    let kind = text(&o, "kind", what)?.unwrap_or_else(|| "adam".into());
    let lr = number(&o, "learningRate", what)?.unwrap_or(1e-3) as f32;
    let opt = match kind.as_str() {
        "adam" => {
            let mut opt = Optimizer::adam(lr);
            if let Some(b) = field(&o, "betas")? {
                let pair: Vec<f64> = Array::from(&b).iter().filter_map(|v| v.as_f64()).collect();
                if !Array::is_array(&b) || pair.len() != 2 {
                    return Err(invalid("optimizer.betas must be two numbers, [beta1, beta2]"));
                }
                opt = opt.betas(pair[0] as f32, pair[1] as f32);
            }
            if let Some(eps) = number(&o, "epsilon", what)? {
                opt = opt.epsilon(eps as f32);
            }
            opt
        }
        "sgd" => {
            let momentum = number(&o, "momentum", what)?.unwrap_or(0.0) as f32;
            let nesterov = match field(&o, "nesterov")? {
                None => false,
                Some(v) => v.as_bool().ok_or_else(|| invalid("optimizer.nesterov must be true or false"))?,
            };
            Optimizer::sgd_momentum(lr, momentum).nesterov(nesterov)
        }
        other => return Err(invalid(format!("optimizer.kind is \"{other}\"; expected \"adam\" or \"sgd\""))),
    };
    let opt = opt.weight_decay(number(&o, "weightDecay", what)?.unwrap_or(0.0) as f32);
    opt.validate()?;
    Ok(opt)
}

fn config_of(spec: &JsValue) -> Result<DenseConfig, WebError> {
    let what = "network";
    let input_size = count(spec, "inputSize", what, 1e9)?
        .ok_or_else(|| invalid("the network has no input size: call .inputSize(n)"))?
        as usize;
    let layers_js = field(spec, "layers")?.unwrap_or_else(|| Array::new().into());
    if !Array::is_array(&layers_js) {
        return Err(invalid("network.layers must be an array of { units, activation }"));
    }
    let mut layers = Vec::new();
    for (i, l) in Array::from(&layers_js).iter().enumerate() {
        let at = format!("layers[{i}]");
        let units =
            count(&l, "units", &at, 1e9)?.ok_or_else(|| invalid(format!("{at} has no units")))? as usize;
        let name = text(&l, "activation", &at)?.unwrap_or_else(|| "identity".into());
        let slope = number(&l, "slope", &at)?.map(|s| s as f32);
        let activation = parse_activation(&name, slope).ok_or_else(|| {
            invalid(format!(
                "{at}: unknown activation \"{name}\"; expected identity, relu, leaky_relu, sigmoid, tanh or softmax"
            ))
        })?;
        layers.push(DenseLayer { units, activation });
    }
    let loss_name =
        text(spec, "loss", what)?.ok_or_else(|| invalid("the network has no loss: call .loss(name)"))?;
    let loss = parse_loss(&loss_name).ok_or_else(|| {
        invalid(format!(
            "unknown loss \"{loss_name}\"; expected mean_squared_error, binary_cross_entropy or categorical_cross_entropy"
        ))
    })?;
    let config = DenseConfig { input_size, layers, loss };
    config.validate()?;
    Ok(config)
}

fn device_of(options: &JsValue) -> Result<DeviceChoice, WebError> {
    match text(options, "device", "options")? {
        None => Ok(DeviceChoice::Auto),
        Some(s) => DeviceChoice::parse(&s),
    }
}

/// Rows of `width` values from JS: an array of rows (arrays or typed arrays), or one flat
/// array or typed array of whole rows.
fn rows_of(value: &JsValue, width: usize, name: &str) -> Result<(Vec<f32>, usize), WebError> {
    let numbers = |v: &JsValue, at: &dyn Fn(usize) -> String| -> Result<Vec<f32>, WebError> {
        if v.is_instance_of::<Float32Array>() {
            return Ok(Float32Array::from(v.clone()).to_vec());
        }
        if js_sys::ArrayBuffer::is_view(v) {
            // Any other typed array: converted element by element, as JS would.
            return Ok(Float64Array::new(v).to_vec().into_iter().map(|x| x as f32).collect());
        }
        if !Array::is_array(v) {
            return Err(invalid(format!("{} must be an array of numbers", at(usize::MAX))));
        }
        Array::from(v)
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_f64().map(|x| x as f32).ok_or_else(|| invalid(format!("{} is not a number", at(i))))
            })
            .collect()
    };
    let nested = Array::is_array(value) && Array::from(value).length() > 0 && {
        let first = Array::from(value).get(0);
        Array::is_array(&first) || js_sys::ArrayBuffer::is_view(&first)
    };
    if nested {
        let mut flat = Vec::new();
        let rows = Array::from(value);
        for (r, row) in rows.iter().enumerate() {
            let at = |i: usize| {
                if i == usize::MAX {
                    format!("{name}[{r}]")
                } else {
                    format!("{name}[{r}][{i}]")
                }
            };
            let v = numbers(&row, &at)?;
            if v.len() != width {
                return Err(invalid(format!(
                    "{name}[{r}] has {} values; the network's rows have {width}",
                    v.len()
                )));
            }
            flat.extend(v);
        }
        return Ok((flat, rows.length() as usize));
    }
    let at = |i: usize| {
        if i == usize::MAX {
            name.to_string()
        } else {
            format!("{name}[{i}]")
        }
    };
    let flat = numbers(value, &at)?;
    if flat.len() % width != 0 {
        return Err(invalid(format!(
            "{name} has {} values, not a whole number of rows of {width}",
            flat.len()
        )));
    }
    let rows = flat.len() / width;
    Ok((flat, rows))
}

struct NetState {
    net: Option<DenseNet>,
    /// The parameters as of the last call that changed them: `toJSON` is synchronous
    /// (JSON.stringify calls it) though a GPU read is not.
    host: DenseFile,
    busy: bool,
    stop: bool,
    disposed: bool,
}

/// A dense feed-forward network, on WebGPU or the wasm CPU path.
#[wasm_bindgen]
pub struct Network {
    state: Rc<RefCell<NetState>>,
    device: &'static str,
    reason: String,
}

impl Network {
    async fn wrap(net: DenseNet) -> Result<Network, WebError> {
        let host = net.snapshot().await?;
        Ok(Network {
            device: net.device(),
            reason: net.reason().to_string(),
            state: Rc::new(RefCell::new(NetState {
                net: Some(net),
                host,
                busy: false,
                stop: false,
                disposed: false,
            })),
        })
    }

    /// Takes the network out for the length of a call (a second call meanwhile is told the
    /// network is busy, never handed an aliased one).
    fn take(&self) -> Result<DenseNet, WebError> {
        let mut s = self.state.borrow_mut();
        if s.disposed {
            return Err(WebError::NetworkDisposed);
        }
        if s.busy {
            return Err(WebError::NetworkBusy);
        }
        let net = s.net.take().ok_or(WebError::NetworkDisposed)?;
        s.busy = true;
        s.stop = false;
        Ok(net)
    }

    fn give_back(&self, net: DenseNet, host: Option<DenseFile>) {
        let mut s = self.state.borrow_mut();
        s.busy = false;
        if let Some(h) = host {
            s.host = h;
        }
        if !s.disposed {
            s.net = Some(net);
        }
    }

    fn widths(&self) -> (usize, usize) {
        let s = self.state.borrow();
        (s.host.config.input_size, s.host.config.output_size())
    }

    /// Inputs and targets from JS, as many rows of each, of the network's widths.
    fn data(&self, x: &JsValue, y: &JsValue) -> Result<(Vec<f32>, Vec<f32>, usize), WebError> {
        let (n_in, n_out) = self.widths();
        let (xs, rows) = rows_of(x, n_in, "x")?;
        let (ys, y_rows) = rows_of(y, n_out, "y")?;
        if rows != y_rows {
            return Err(invalid(format!("x has {rows} rows but y has {y_rows}")));
        }
        Ok((xs, ys, rows))
    }

    async fn with_data<T>(
        &self, x: &JsValue, y: &JsValue, f: impl AsyncFnOnce(&mut DenseNet, &Rows<'_>) -> Result<T, WebError>,
    ) -> Result<T, WebError> {
        let (xs, ys, rows) = self.data(x, y)?;
        let mut net = self.take()?;
        let r = f(&mut net, &Rows { x: &xs, y: &ys, rows }).await;
        self.give_back(net, None);
        r
    }

    async fn fit_inner(
        &self, x: JsValue, y: JsValue, options: JsValue, on_epoch: Option<Function>,
    ) -> Result<Vec<f32>, WebError> {
        let what = "fit options";
        let epochs = count(&options, "epochs", what, 1e9)?.unwrap_or(10) as usize;
        let batch_size = count(&options, "batchSize", what, 1e9)?.unwrap_or(32) as usize;
        if batch_size == 0 {
            return Err(invalid("fit: batchSize must be at least 1"));
        }
        let shuffle = match field(&options, "shuffle")? {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| invalid("fit options.shuffle must be true or false"))?,
        };
        let seed = match count(&options, "seed", what, MAX_SAFE)? {
            Some(s) => s,
            None => (js_sys::Math::random() * 4_294_967_296.0) as u64,
        };
        let (xs, ys, rows) = self.data(&x, &y)?;
        let data = Rows { x: &xs, y: &ys, rows };
        // Every way out from here hands the network back. (train_epoch checks the data,
        // NaN included, before it touches the weights.)
        let mut net = self.take()?;
        let mut order = EpochOrder::new(rows, shuffle, seed);
        let mut history = Vec::new();
        let mut result = Ok(());
        for epoch in 1..=epochs {
            let loss = match net.train_epoch(&data, order.next_epoch(), batch_size).await {
                Ok(l) => l as f32,
                Err(e) => {
                    result = Err(invalid(format!("epoch {epoch}: {e}")));
                    break;
                }
            };
            history.push(loss);
            if let Some(f) = &on_epoch {
                match f.call2(&JsValue::NULL, &(epoch as f64).into(), &(loss as f64).into()) {
                    Ok(v) if v.as_bool() == Some(false) => break,
                    Ok(_) => {}
                    Err(e) => {
                        let m = e
                            .dyn_ref::<js_sys::Error>()
                            .map(|e| String::from(e.message()))
                            .unwrap_or_else(|| format!("{e:?}"));
                        result = Err(invalid(format!("the onEpoch callback threw: {m}")));
                        break;
                    }
                }
            }
            // One event-loop turn an epoch: a worker sees a stop message, a page repaints.
            next_turn().await;
            if self.state.borrow().stop {
                break;
            }
        }
        // The host copy follows the weights, whatever ended the run.
        let host = net.snapshot().await;
        let (host, snap_err) = match host {
            Ok(h) => (Some(h), None),
            Err(e) => (None, Some(e)),
        };
        self.give_back(net, host);
        result?;
        if let Some(e) = snap_err {
            return Err(e);
        }
        Ok(history)
    }
}

#[wasm_bindgen]
impl Network {
    /// A new network from `{ inputSize, layers: [{ units, activation, slope? }], loss,
    /// optimizer: { kind, learningRate, ... }, seed, device }`; `NetworkBuilder` writes it.
    pub async fn create(spec: JsValue) -> Result<Network, JsError> {
        async {
            let config = config_of(&spec)?;
            let optimizer = optimizer_of(&spec)?;
            let seed = count(&spec, "seed", "network", MAX_SAFE)?.unwrap_or(0);
            let net = DenseNet::new(config, optimizer, seed, device_of(&spec)?).await?;
            Network::wrap(net).await
        }
        .await
        .map_err(js_err)
    }

    /// A network from its JSON file (native `save_json`'s format): the text, or the parsed
    /// object. `options.device` as for `create`.
    #[wasm_bindgen(js_name = fromJSON)]
    pub async fn from_json(file: JsValue, options: JsValue) -> Result<Network, JsError> {
        async {
            let text = match file.as_string() {
                Some(t) => t,
                None if file.is_object() => js_sys::JSON::stringify(&file)
                    .map_err(|_| invalid("the network file object cannot be written as JSON"))?
                    .into(),
                None => return Err(invalid("fromJSON takes the file's text or its parsed object")),
            };
            let net = DenseNet::from_json(text.as_bytes(), device_of(&options)?).await?;
            Network::wrap(net).await
        }
        .await
        .map_err(js_err)
    }

    /// Trains for `options.epochs` (10) epochs of `options.batchSize` (32) rows, shuffled
    /// before each epoch (`shuffle`, default true) by `options.seed` (random when absent).
    /// `onEpoch(epoch, loss)` after each epoch; returning `false` stops. Resolves to each
    /// epoch's mean training loss.
    pub async fn fit(
        &self, x: JsValue, y: JsValue, options: JsValue, on_epoch: Option<Function>,
    ) -> Result<Float32Array, JsError> {
        let history = self.fit_inner(x, y, options, on_epoch).await.map_err(js_err)?;
        Ok(Float32Array::from(history.as_slice()))
    }

    /// Outputs for each row of `x`: an array of `Float32Array`s.
    pub async fn predict(&self, x: JsValue) -> Result<Array, JsError> {
        async {
            let (n_in, n_out) = self.widths();
            let (xs, rows) = rows_of(&x, n_in, "x")?;
            let mut net = self.take()?;
            let r = net.predict(&xs, rows).await;
            self.give_back(net, None);
            let out = r?;
            Ok(out.chunks_exact(n_out).map(|r| JsValue::from(Float32Array::from(r))).collect::<Array>())
        }
        .await
        .map_err(js_err)
    }

    /// The mean loss over the rows, forward only.
    pub async fn evaluate(&self, x: JsValue, y: JsValue) -> Result<f64, JsError> {
        self.with_data(&x, &y, async |net, data| net.loss(data).await).await.map_err(js_err)
    }

    /// Share of rows classified correctly (argmax; a 0.5 threshold for one output).
    pub async fn accuracy(&self, x: JsValue, y: JsValue) -> Result<f64, JsError> {
        self.with_data(&x, &y, async |net, data| net.accuracy(data).await).await.map_err(js_err)
    }

    /// The network as native `save_json` writes it, parsed: `JSON.stringify(network)`
    /// gives a file native `load_json` reads. (The seed, a u64 in the file, is a JS number
    /// here: exact below 2^53.)
    #[wasm_bindgen(js_name = toJSON)]
    pub fn to_json(&self) -> Result<JsValue, JsError> {
        let s = self.state.borrow();
        if s.disposed {
            return Err(js_err(WebError::NetworkDisposed));
        }
        let mut file = s.host.clone();
        if let Some(net) = &s.net {
            file.optimizer = net.optimizer;
        }
        let text = dense_file::to_json(&file).map_err(|e| js_err(e.into()))?;
        js_sys::JSON::parse(&text).map_err(|_| js_err(invalid("the network file did not parse")))
    }

    /// Changes the learning rate from the next step on (between `fit` calls).
    #[wasm_bindgen(js_name = setLearningRate)]
    pub fn set_learning_rate(&self, learning_rate: f64) -> Result<(), JsError> {
        let mut s = self.state.borrow_mut();
        let busy = s.busy;
        let net = s
            .net
            .as_mut()
            .ok_or_else(|| js_err(if busy { WebError::NetworkBusy } else { WebError::NetworkDisposed }))?;
        let mut opt = net.optimizer;
        opt.set_learning_rate(learning_rate as f32);
        opt.validate().map_err(|e| js_err(e.into()))?;
        net.optimizer = opt;
        Ok(())
    }

    /// The architecture: `{ inputSize, outputSize, layers, loss, parameters, seed }`.
    pub fn info(&self) -> Object {
        let s = self.state.borrow();
        let c = &s.host.config;
        let info = Object::new();
        set(&info, "inputSize", c.input_size as f64);
        set(&info, "outputSize", c.output_size() as f64);
        let layers = Array::new();
        for l in &c.layers {
            let o = Object::new();
            let (name, slope) = dense_file::activation_name(l.activation);
            set(&o, "units", l.units as f64);
            set(&o, "activation", name);
            if let Some(s) = slope {
                set(&o, "slope", s as f64);
            }
            layers.push(&o);
        }
        set(&info, "layers", layers);
        set(&info, "loss", dense_file::loss_name(c.loss));
        set(&info, "parameters", c.parameter_count() as f64);
        set(&info, "seed", s.host.seed as f64);
        info
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> String {
        self.device.into()
    }

    /// Why that device ("WebGPU adapter ...", or why not).
    #[wasm_bindgen(js_name = deviceReason)]
    pub fn device_reason(&self) -> String {
        self.reason.clone()
    }

    /// Asks a running `fit` to stop after the current epoch.
    pub fn stop(&self) {
        self.state.borrow_mut().stop = true;
    }

    /// Frees the network's memory; later calls are errors.
    pub fn dispose(&self) {
        let mut s = self.state.borrow_mut();
        s.disposed = true;
        s.net = None;
    }
}
