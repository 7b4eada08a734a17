// Serves the demo page on http://localhost:8080 (or $PORT): www/ itself, with the npm
// package built by web/build-npm.sh under /pkg/. No dependencies beyond Node.
//
//     node www/serve.mjs
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const roots = { '/pkg/': resolve(here, '..', 'web', 'pkg'), '/': resolve(here) };
const types = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.ts': 'text/plain; charset=utf-8',
  '.rbw': 'application/octet-stream',
  '.css': 'text/css; charset=utf-8',
  '.png': 'image/png',
};

/** Starts the server; resolves to it once it listens. */
export function serve(port = Number(process.env.PORT ?? 8080)) {
  const server = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    const prefix = path.startsWith('/pkg/') ? '/pkg/' : '/';
    const root = roots[prefix];
    const file = normalize(join(root, path.slice(prefix.length) || 'index.html'));
    if (!file.startsWith(root + sep) && file !== root) {
      res.writeHead(403).end();
      return;
    }
    try {
      const body = await readFile(file.endsWith(sep) ? join(file, 'index.html') : file);
      res.writeHead(200, { 'content-type': types[extname(file)] ?? 'application/octet-stream', 'cache-control': 'no-store' });
      res.end(body);
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${path}`);
    }
  });
  return new Promise((resolve) => server.listen(port, '127.0.0.1', () => resolve(server)));
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const server = await serve();
  const { port } = server.address();
  console.log(`rusting_brain demo on http://localhost:${port}/ (models from www/models/, package from web/pkg/)`);
}
