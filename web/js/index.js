// rusting-brain: int8 language models and trainable dense networks in the browser (WebGPU,
// or the wasm CPU path) and under Node (the CPU path). A thin layer over the wasm-bindgen
// glue in ./dist: it loads the .wasm once, from the file beside this one in Node and by URL
// everywhere else.
import init, { Model, Network, Tokenizer, TransformerLm } from './dist/rusting_brain.js';

export { Model, Network, Tokenizer, TransformerLm };

let ready = null;

const inNode =
  typeof process !== 'undefined' &&
  process.versions != null &&
  process.versions.node != null &&
  typeof window === 'undefined' &&
  typeof WorkerGlobalScope === 'undefined';

/**
 * Instantiates the wasm module (once; later calls return the same promise). `wasm` may be
 * a URL, a Response, bytes or a WebAssembly.Module; by default the package's own file.
 */
export function initialize(wasm) {
  if (ready === null) {
    ready = (async () => {
      let source = wasm;
      if (source === undefined && inNode) {
        const { readFile } = await import('node:fs/promises');
        source = await readFile(new URL('./dist/rusting_brain_bg.wasm', import.meta.url));
      }
      await init(source === undefined ? undefined : { module_or_path: source });
    })();
    ready.catch(() => {
      ready = null;
    });
  }
  return ready;
}

async function bytesOf(weights) {
  if (weights instanceof Uint8Array) return weights;
  if (weights instanceof ArrayBuffer) return new Uint8Array(weights);
  if (ArrayBuffer.isView(weights)) return new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength);
  // A File (an <input type="file"> or a drop) or any Blob.
  if (typeof Blob !== 'undefined' && weights instanceof Blob) return new Uint8Array(await weights.arrayBuffer());
  throw new TypeError('weights must be a Uint8Array, an ArrayBuffer, a typed array or a Blob/File of the .rbw or GGUF file');
}

/**
 * Loads a model from the bytes of its .rbw file and the text of its tokenizer.json, or from
 * a GGUF file alone (it carries its tokenizer and chat template): `loadModel(gguf,
 * options)` or `loadModel(gguf, undefined, options)`. The file is bytes (a Uint8Array, an
 * ArrayBuffer, a typed array) or a Blob, such as the File a page was given.
 */
export async function loadModel(weights, tokenizerJson, options = {}) {
  if (tokenizerJson !== undefined && tokenizerJson !== null && typeof tokenizerJson === 'object') {
    options = tokenizerJson;
    tokenizerJson = undefined;
  }
  if (tokenizerJson !== undefined && tokenizerJson !== null && typeof tokenizerJson !== 'string') {
    throw new TypeError('tokenizerJson must be the text of tokenizer.json (left out for a GGUF file)');
  }
  await initialize();
  return Model.load(await bytesOf(weights), tokenizerJson ?? undefined, options);
}

/**
 * Fetches a model's .rbw file and tokenizer.json, or a GGUF file alone
 * (`fetchModel(ggufUrl, options)`), then loads them.
 */
export async function fetchModel(weightsUrl, tokenizerUrl, options = {}) {
  const get = async (url) => {
    const r = await fetch(url);
    if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status} ${r.statusText}`);
    return r;
  };
  if (typeof tokenizerUrl !== 'string' && !(tokenizerUrl instanceof URL)) {
    const w = await get(weightsUrl);
    return loadModel(new Uint8Array(await w.arrayBuffer()), undefined, tokenizerUrl ?? options);
  }
  const [w, t] = await Promise.all([get(weightsUrl), get(tokenizerUrl)]);
  return loadModel(new Uint8Array(await w.arrayBuffer()), await t.text(), options);
}

/**
 * Collects a dense network's architecture, then `build()` makes it (after loading the
 * wasm module). Checked in Rust: a zero width, an unknown activation or loss, a bad
 * optimizer setting is an Error from build().
 */
export class NetworkBuilder {
  constructor() {
    this.spec = { layers: [] };
  }
  /** Width of an input row. */
  inputSize(n) {
    this.spec.inputSize = n;
    return this;
  }
  /** A fully connected layer of `units` outputs, then `activation` ("identity", "relu",
   * "leaky_relu" (with `slope`), "sigmoid", "tanh", "softmax"). */
  dense(units, activation = 'identity', slope) {
    this.spec.layers.push(slope === undefined ? { units, activation } : { units, activation, slope });
    return this;
  }
  /** "mean_squared_error", "binary_cross_entropy" or "categorical_cross_entropy". */
  loss(name) {
    this.spec.loss = name;
    return this;
  }
  /** `{ kind: "adam" | "sgd", learningRate, betas, epsilon, momentum, nesterov, weightDecay }`. */
  optimizer(options) {
    this.spec.optimizer = options;
    return this;
  }
  /** Seed of the weight initialisation (default 0): the same seed draws the same weights as native. */
  seed(n) {
    this.spec.seed = n;
    return this;
  }
  /** "auto" (default), "webgpu" or "cpu". */
  device(d) {
    this.spec.device = d;
    return this;
  }
  async build() {
    await initialize();
    return Network.create(this.spec);
  }
}

/** A new `NetworkBuilder`. */
Network.builder = () => new NetworkBuilder();

// The static loader also works before the wasm module is loaded.
const fromJSONOfGlue = Network.fromJSON;
Network.fromJSON = async (file, options = {}) => {
  await initialize();
  return fromJSONOfGlue.call(Network, file, options);
};

/** The trained model, loaded for generation through `loadModel` (int8, on the chosen device). */
TransformerLm.prototype.toModel = async function toModel(tokenizer, options = {}) {
  const json = typeof tokenizer === 'string' ? tokenizer : JSON.stringify(tokenizer);
  return loadModel(await this.toBytes(), json, options);
};
