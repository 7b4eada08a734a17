// Types of the rusting-brain package (the wasm-bindgen declarations, with the option
// and result objects spelled out).

/** Where a model computes: WebGPU, or the CPU in WebAssembly (SIMD128). */
export type Device = 'webgpu' | 'cpu';

/** Options of `loadModel`, `fetchModel` and `Model.load`. */
export interface LoadOptions {
  /** "auto" (default): WebGPU where the browser has a hardware adapter, else the CPU (a software adapter such as SwiftShader is slower than the CPU path). */
  device?: 'auto' | 'webgpu' | 'cpu';
  /** A GGUF file's matrices rounded to int8 ("q8", the default) or four bits ("q4"; the embedding and output head stay int8). */
  precision?: 'q8' | 'q4';
  /** A GGUF model's context: the positions a conversation may take (default 2048, at most the file's own). */
  context?: number;
}

/** Options of `chatTurn`: `generate`'s, and a system prompt for the first turn. */
export interface ChatTurnOptions extends GenerateOptions {
  /** The system message, rendered before the first user message. */
  system?: string;
}

/** What `chatTurn` resolves to: `generate`'s result, and the tokens the KV cache already held. */
export interface ChatTurnResult extends GenerateResult {
  /** Tokens of the conversation before this turn that were not fed again. */
  reusedTokens: number;
}

/** One turn of a conversation, as chat templates read it. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

/** Options of `generate` and `chat`; every field may be left out. */
export interface GenerateOptions {
  /** Most new tokens (default 64). */
  maxTokens?: number;
  /** 0 (default) is greedy; above 0, sampling from softmax(logits / temperature). */
  temperature?: number;
  /** Keep only the k most likely tokens (0 or absent: all). */
  topK?: number;
  /** Keep the smallest set of tokens whose probability reaches p, in (0, 1]. */
  topP?: number;
  /** Divides positive logits and multiplies negative ones of tokens already in the context (1: off). */
  repetitionPenalty?: number;
  /** The sampler's seed (an integer up to 2^53 - 1); the same seed gives the same ids on every device. Random when absent. */
  seed?: number;
  /** Stop at the end of a reply: a GGUF file's end-of-sequence token, else `<|end|>`, `<|im_end|>` or `<|eot_id|>`, the first the vocabulary has (default true). */
  stopAtEnd?: boolean;
  /** Aborting it stops the generation after the current token, like `model.stop()`. */
  signal?: AbortSignal;
}

/** What `generate` and `chat` resolve to. */
export interface GenerateResult {
  /** The new text (the prompt not included). */
  text: string;
  /** The new ids. */
  ids: Uint32Array;
  /** Tokens of the prompt (of this turn). */
  promptTokens: number;
  /** New tokens. */
  tokens: number;
  /** From the call to the first new token: prompt encoding, prefill and the first draw. */
  firstTokenMs: number;
  /** From the call to the end. */
  totalMs: number;
  /** Tokens after the first, per second of decoding. */
  tokensPerSecond: number;
  /** Where it ran. */
  device: Device;
  /** Why it ended: `maxTokens` reached, the end of a reply drawn, stopped, or the context full. */
  finish: 'length' | 'end' | 'stopped' | 'max_seq_len';
}

/** A loaded model's architecture. */
export interface ModelInfo {
  /** Token ids run from 0 to `vocabSize - 1`. */
  vocabSize: number;
  /** Width of the residual stream. */
  dModel: number;
  /** Transformer blocks. */
  nLayers: number;
  /** The longest conversation (prompt and replies) it takes. */
  maxSeqLen: number;
  /** Weights in all. */
  parameters: number;
  /** Routed experts per sparse block (0 for a dense model). */
  experts: number;
}

/** Called with each new token's text (empty while a character is incomplete) and id; return false to stop. */
export type OnToken = (text: string, id: number) => boolean | void;

/** A loaded language model and its conversation. */
export class Model {
  private constructor();
  /** Loads the bytes of an `.rbw` file (Q8, or F32 quantized on load) and the text of its tokenizer.json, or a GGUF file's bytes alone (`tokenizerJson` undefined) (`initialize()` first; `loadModel` does both). */
  static load(weights: Uint8Array, tokenizerJson: string | undefined, options?: LoadOptions): Promise<Model>;
  /** Where the model runs. */
  device(): Device;
  /** Why that device ("WebGPU adapter ...", or why there is no WebGPU). */
  deviceReason(): string;
  /** The architecture. */
  info(): ModelInfo;
  /** The ids of `text` in the model's vocabulary. */
  encode(text: string): Uint32Array;
  /** The text of `ids`; an id outside the vocabulary is an Error. */
  decode(ids: Uint32Array | number[]): string;
  /** A continuation of `prompt`, from a fresh conversation. */
  generate(prompt: string, options?: GenerateOptions, onToken?: OnToken): Promise<GenerateResult>;
  /** A continuation of the conversation so far (the KV cache keeps earlier turns). */
  chat(text: string, options?: GenerateOptions, onToken?: OnToken): Promise<GenerateResult>;
  /** The user's next message, answered through the model's chat template (a GGUF file's): the conversation is rendered each turn and only the tokens past what the KV cache holds are fed. */
  chatTurn(text: string, options?: ChatTurnOptions, onToken?: OnToken): Promise<ChatTurnResult>;
  /** The conversation `chatTurn` has held. */
  messages(): ChatMessage[];
  /** The chat template's Jinja source, where the model came with one (a GGUF file). */
  chatTemplate(): string | undefined;
  /** Ends a running generation after its current token. */
  stop(): void;
  /** Forgets the conversation (`chatTurn`'s messages too). */
  reset(): void;
  /** Frees the model's memory, GPU buffers included. */
  dispose(): void;
  /** wasm-bindgen's release of the JS handle (`dispose()` frees the memory at once). */
  free(): void;
}

/** Instantiates the wasm module once (later calls return the same promise): by default the package's own file, or a URL, Response, bytes or module. */
export function initialize(wasm?: string | URL | Response | BufferSource | WebAssembly.Module): Promise<void>;
/** `initialize()`, then `Model.load` from the file's bytes and the tokenizer's text (left out for a GGUF file). */
export function loadModel(weights: Uint8Array | ArrayBuffer | ArrayBufferView | Blob, tokenizerJson: string, options?: LoadOptions): Promise<Model>;
/** A GGUF file (its bytes, or a Blob such as a chosen or dropped File), its tokenizer and chat template from the file. */
export function loadModel(gguf: Uint8Array | ArrayBuffer | ArrayBufferView | Blob, options?: LoadOptions): Promise<Model>;
/** Fetches the `.rbw` file and tokenizer.json (or a GGUF file alone), then `loadModel`. */
export function fetchModel(weightsUrl: string | URL, tokenizerUrl: string | URL, options?: LoadOptions): Promise<Model>;
export function fetchModel(ggufUrl: string | URL, options?: LoadOptions): Promise<Model>;

/** What follows a dense layer (`leaky_relu` takes a slope, default 0.01). */
export type Activation = 'identity' | 'relu' | 'leaky_relu' | 'sigmoid' | 'tanh' | 'softmax';
/** What a network minimizes (binary cross-entropy after a sigmoid, categorical after a softmax). */
export type LossName = 'mean_squared_error' | 'binary_cross_entropy' | 'categorical_cross_entropy';

/** The optimizer of a `Network`. */
export interface OptimizerOptions {
  /** "adam" (default) or "sgd". */
  kind?: 'adam' | 'sgd';
  /** Default 1e-3. */
  learningRate?: number;
  /** Adam's (beta1, beta2), default [0.9, 0.999]. */
  betas?: [number, number];
  /** Adam's epsilon, default 1e-8. */
  epsilon?: number;
  /** SGD's momentum, default 0. */
  momentum?: number;
  /** SGD's Nesterov momentum. */
  nesterov?: boolean;
  /** Decoupled for Adam (AdamW), L2 for SGD. */
  weightDecay?: number;
}

/** What `Network.create` takes (`NetworkBuilder` writes it). */
export interface NetworkSpec {
  /** Width of an input row. */
  inputSize: number;
  /** The layers, input to output: width, activation (default identity), leaky ReLU's slope. */
  layers: { units: number; activation?: Activation; slope?: number }[];
  /** What training minimizes. */
  loss: LossName;
  /** Default: Adam at 1e-3. */
  optimizer?: OptimizerOptions;
  /** Seed of the weight initialisation (default 0): native's weights for the same seed. */
  seed?: number;
  /** "auto" (default: WebGPU where there is a hardware adapter), "webgpu" or "cpu". */
  device?: 'auto' | 'webgpu' | 'cpu';
}

/** Options of `Network.fit`. */
export interface FitOptions {
  /** Default 10. */
  epochs?: number;
  /** Default 32. */
  batchSize?: number;
  /** Reshuffle the rows before every epoch (default true). */
  shuffle?: boolean;
  /** The shuffling seed; the same seed repeats a native run's order. Random when absent. */
  seed?: number;
}

/** Rows of numbers: an array of rows (arrays or typed arrays), or one flat array of whole rows. */
export type Rows = number[][] | Float32Array[] | Float32Array | Float64Array | number[];

/** The network file native `save_json` writes (format "rusting_brain.network", version 1). */
export interface NetworkFile {
  /** Always "rusting_brain.network". */
  format: 'rusting_brain.network';
  /** The file format's version (1). */
  version: number;
  /** Width of an input row. */
  input_size: number;
  /** What training minimizes. */
  loss: LossName;
  /** The optimizer's settings (its state is not saved). */
  optimizer: { kind: 'adam' | 'sgd'; learning_rate: number; weight_decay: number; momentum?: number; nesterov?: boolean; betas?: [number, number]; epsilon?: number };
  /** The seed the weights were drawn from. */
  seed: number;
  /** Per layer: `units` rows of weights (PyTorch's `Linear.weight` layout) and the bias. */
  layers: { units: number; activation: Activation; leaky_slope?: number; weights: number[][]; bias: number[] }[];
}

/** A network's architecture. */
export interface NetworkInfo {
  /** Width of an input row. */
  inputSize: number;
  /** Width of an output row. */
  outputSize: number;
  /** The layers, input to output. */
  layers: { units: number; activation: Activation; slope?: number }[];
  /** What training minimizes. */
  loss: LossName;
  /** Weights and biases. */
  parameters: number;
  /** The seed the weights were drawn from. */
  seed: number;
}

/** A dense feed-forward network, trained in the page on WebGPU or the CPU path. */
export class Network {
  private constructor();
  /** A `NetworkBuilder`. */
  static builder(): NetworkBuilder;
  /** A new network from a spec (`initialize()` first; the builder does both). */
  static create(spec: NetworkSpec): Promise<Network>;
  /** From the file's text or its parsed object (what `toJSON()` returns, or native `save_json` wrote). */
  static fromJSON(file: string | NetworkFile, options?: { device?: 'auto' | 'webgpu' | 'cpu' }): Promise<Network>;
  /** Trains; `onEpoch(epoch, meanLoss)` after each epoch, returning false stops. Resolves to each epoch's mean loss. */
  fit(x: Rows, y: Rows, options?: FitOptions, onEpoch?: (epoch: number, loss: number) => boolean | void): Promise<Float32Array>;
  /** One output row per input row. */
  predict(x: Rows): Promise<Float32Array[]>;
  /** Mean loss, forward only. */
  evaluate(x: Rows, y: Rows): Promise<number>;
  /** Share of rows classified right (argmax; a 0.5 threshold for one output). */
  accuracy(x: Rows, y: Rows): Promise<number>;
  /** The native file format as an object: `JSON.stringify(network)` is a file native `load_json` reads. */
  toJSON(): NetworkFile;
  /** The rate from the next step on. */
  setLearningRate(learningRate: number): void;
  /** The architecture. */
  info(): NetworkInfo;
  /** Where the network computes. */
  device(): Device;
  /** Why that device. */
  deviceReason(): string;
  /** Stops a running fit after its current epoch. */
  stop(): void;
  /** Frees the network's memory (GPU buffers included); later calls are Errors. */
  dispose(): void;
  /** wasm-bindgen's release of the JS handle. */
  free(): void;
}

/** Collects a network's architecture; `build()` checks it (in Rust) and makes the network. */
export class NetworkBuilder {
  /** Width of an input row. */
  inputSize(n: number): this;
  /** Appends a layer of `units` outputs and its activation (default identity). */
  dense(units: number, activation?: Activation, slope?: number): this;
  /** What training minimizes (required). */
  loss(name: LossName): this;
  /** Default: Adam at 1e-3. */
  optimizer(options: OptimizerOptions): this;
  /** Seed of the weight initialisation (default 0). */
  seed(n: number): this;
  /** "auto" (default), "webgpu" or "cpu". */
  device(d: 'auto' | 'webgpu' | 'cpu'): this;
  /** Loads the wasm module if needed and makes the network; a bad setting is an Error naming it. */
  build(): Promise<Network>;
}

/** A byte-level BPE tokenizer (the `language_model` example's kind). */
export class Tokenizer {
  private constructor();
  /** A vocabulary of `vocabSize` (default 512) entries trained on `text`: 256 byte symbols, `<|end|>`, merges. */
  static train(text: string, options?: { vocabSize?: number }): Tokenizer;
  /** From the text of a tokenizer.json, or its parsed object. */
  static fromJSON(file: string | object): Tokenizer;
  /** The ids of `text`. */
  encode(text: string): Uint32Array;
  /** The text of `ids`; an id outside the vocabulary is an Error. */
  decode(ids: Uint32Array | number[]): string;
  /** Entries, added tokens included. */
  vocabSize(): number;
  /** The id of `<|end|>`, where the vocabulary has it. */
  endId(): number | undefined;
  /** The tokenizer.json file as an object: `JSON.stringify(tokenizer)` writes it. */
  toJSON(): object;
  /** wasm-bindgen's release of the JS handle. */
  free(): void;
}

/** What `TransformerLm.create` takes. */
export interface LmConfig {
  /** Token ids run from 0 to `vocabSize - 1` (the tokenizer's `vocabSize()`). */
  vocabSize: number;
  /** Width of the residual stream. */
  dModel: number;
  /** Transformer blocks. */
  nLayers: number;
  /** Query heads. */
  heads: number;
  /** Key/value heads (default: `heads`). */
  kvHeads?: number;
  /** Width of each head. */
  headDim: number;
  /** Hidden width of the SwiGLU feed-forward. */
  dFF: number;
  /** The longest sequence the model takes (a training row holds up to `maxSeqLen + 1` ids). */
  maxSeqLen: number;
  /** Seed of the initialization (default 0): the native builder's weights for the same settings. */
  seed?: number;
  /** Adam: `learningRate` (default 1e-3), `beta1`, `beta2`, `weightDecay`. */
  optimizer?: { learningRate?: number; beta1?: number; beta2?: number; weightDecay?: number };
  /** "auto" (default: WebGPU where there is a hardware adapter), "webgpu" or "cpu". */
  device?: 'auto' | 'webgpu' | 'cpu';
}

/** What `trainStep` resolves to. */
export interface LmStep {
  /** Mean loss per token, in nats. */
  loss: number;
  /** Positions counted in the loss. */
  tokens: number;
  /** Global L2 norm of the gradients before clipping. */
  gradNorm: number;
  /** Time the step took. */
  ms: number;
}

/** A small decoder-only transformer trained in the page, on WebGPU or the wasm CPU path. */
export class TransformerLm {
  private constructor();
  /** A new model (the native builder's for the same settings and seed) on the chosen device. */
  static create(config: LmConfig): Promise<TransformerLm>;
  /** One optimizer step on equal-length id sequences (at most maxSeqLen + 1 ids each). */
  trainStep(batch: (number[] | Uint32Array)[], options?: { clip?: number }): Promise<LmStep>;
  /** Mean loss per token, forward only. */
  evaluate(batch: (number[] | Uint32Array)[]): Promise<{ loss: number; tokens: number }>;
  /** The rate from the next step on (a schedule is one call a step). */
  setLearningRate(learningRate: number): void;
  /** The F32 .rbw file: native `TransformerLm::load_bin` reads it, and so does `loadModel`. */
  toBytes(): Promise<Uint8Array>;
  /** The architecture and the steps taken. */
  info(): { vocabSize: number; dModel: number; nLayers: number; maxSeqLen: number; parameters: number; steps: number };
  /** Where the model trains. */
  device(): Device;
  /** Why that device. */
  deviceReason(): string;
  /** The trained model, loaded for generation (int8, as `loadModel` loads an F32 file). */
  toModel(tokenizer: Tokenizer | string, options?: LoadOptions): Promise<Model>;
  /** Frees the model's memory (GPU buffers included); later calls are Errors. */
  dispose(): void;
  /** wasm-bindgen's release of the JS handle. */
  free(): void;
}
