// The Train page's network, off the page's thread. Messages in: train, stop. Messages out:
// ready (the device), epoch (loss and timing), boundary (a grid of predictions for 2-D
// data), done (accuracies, the network file), error.
import { Network } from './pkg/index.js';

let net = null;
let stopRequested = false;

async function train({ spec, data, fit, grid, every }) {
  stopRequested = false;
  net?.dispose();
  net = null;
  const builder = Network.builder().inputSize(spec.inputSize).loss(spec.loss).seed(spec.seed).device(spec.device)
    .optimizer({ kind: 'adam', learningRate: spec.learningRate });
  for (const l of spec.layers) builder.dense(l.units, l.activation);
  net = await builder.build();
  postMessage({ type: 'ready', device: net.device(), reason: net.deviceReason(), info: net.info() });
  const { x, y, xTest, yTest } = data;
  let trainMs = 0;
  let epochs = 0;
  const boundary = async () => {
    if (grid) postMessage({ type: 'boundary', epoch: epochs, values: (await net.predict(grid)).map((r) => r[0]) });
  };
  await boundary();
  // Chunks of `every` epochs, the boundary redrawn between them; each chunk reshuffles
  // from its own seed (fit's), so a run repeats for the same settings.
  while (epochs < fit.epochs && !stopRequested) {
    const n = Math.min(every, fit.epochs - epochs);
    const t0 = performance.now();
    let last = performance.now();
    const history = await net.fit(x, y, { epochs: n, batchSize: fit.batchSize, shuffle: true, seed: fit.seed + epochs }, (e, loss) => {
      const now = performance.now();
      postMessage({ type: 'epoch', epoch: epochs + e, loss, ms: now - last });
      last = now;
      return !stopRequested;
    });
    trainMs += performance.now() - t0;
    epochs += history.length;
    await boundary();
  }
  // One call at a time: a network answers a second call while one runs with an error.
  const trainAccuracy = await net.accuracy(x, y);
  const testAccuracy = await net.accuracy(xTest, yTest);
  const testLoss = await net.evaluate(xTest, yTest);
  postMessage({
    type: 'done', epochs, stopped: stopRequested, trainAccuracy, testAccuracy, testLoss,
    samplesPerSecond: (epochs * x.length) / (trainMs / 1000), file: net.toJSON(),
  });
}

onmessage = async ({ data }) => {
  if (data.type === 'stop') {
    stopRequested = true;
    net?.stop();
    return;
  }
  try {
    if (data.type === 'train') await train(data);
  } catch (e) {
    postMessage({ type: 'error', message: String(e && e.message ? e.message : e) });
  }
};
