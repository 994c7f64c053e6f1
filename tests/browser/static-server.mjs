// A small static file server for the deploy tests, standing in for the hosts trainmem is
// deployed to. Two kinds:
//   - `precompressed: true` serves the .br/.gz sibling a request accepts (as nginx
//     gzip_static/brotli_static and Caddy's `precompressed` do), with Vary: Accept-Encoding;
//     `encodings` limits which (['gzip'] for "served gzip-compressed");
//   - `headers: true` applies dist/_headers (as Netlify and Cloudflare Pages do).
// Always: ETag / If-None-Match (304), the right MIME types, index.html for a folder, and a log
// of every request it answered. Listens on 127.0.0.1 only.
import { createServer } from 'node:http';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, extname, normalize } from 'node:path';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.json': 'application/json',
  '.webmanifest': 'application/manifest+json',
  '.txt': 'text/plain; charset=utf-8',
};

/** Parses _headers: `/path` lines, then indented `Name: value` lines. Exact paths only. */
export function parseHeaders(text) {
  const rules = new Map();
  let current = null;
  for (const line of text.split('\n')) {
    if (!line.trim() || line.trimStart().startsWith('#')) continue;
    if (!/^\s/.test(line)) {
      current = line.trim();
      if (!rules.has(current)) rules.set(current, []);
    } else if (current) {
      const i = line.indexOf(':');
      rules.get(current).push([line.slice(0, i).trim(), line.slice(i + 1).trim()]);
    }
  }
  return rules;
}

/**
 * Serves `root` (the web root; the app may sit in a sub-folder of it).
 * @returns {Promise<{origin: string, log: object[], close: () => Promise<void>}>}
 */
export async function startServer({ root, precompressed = false, encodings = ['br', 'gzip'], headers = false, headersBase = '/' }) {
  const log = [];
  const rulesFor = () => {
    // _headers may sit in the app's folder (headersBase) rather than at the web root.
    const file = join(root, headersBase, '_headers');
    if (!headers || !existsSync(file)) return new Map();
    const rules = parseHeaders(readFileSync(file, 'utf8'));
    if (headersBase === '/') return rules;
    return new Map([...rules].map(([p, h]) => [headersBase.replace(/\/$/, '') + p, h]));
  };
  const server = createServer((req, res) => {
    const url = new URL(req.url, 'http://x');
    let path = decodeURIComponent(url.pathname);
    const entry = { path, status: 0, encoding: null, conditional: Boolean(req.headers['if-none-match']) };
    log.push(entry);
    const send = (status, body = '', extra = {}) => {
      entry.status = status;
      res.writeHead(status, extra);
      res.end(req.method === 'HEAD' ? undefined : body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405);
    let file = normalize(join(root, path));
    if (!file.startsWith(normalize(root))) return send(403);
    if (existsSync(file) && statSync(file).isDirectory()) {
      if (!path.endsWith('/')) return send(301, '', { Location: path + '/' + url.search });
      file = join(file, 'index.html');
    }
    if (!existsSync(file) || !statSync(file).isFile()) return send(404, 'not found', { 'Content-Type': 'text/plain' });
    const out = { 'Content-Type': TYPES[extname(file)] || 'application/octet-stream' };
    let body = file;
    if (precompressed) {
      out.Vary = 'Accept-Encoding';
      const accepted = String(req.headers['accept-encoding'] || '');
      for (const [enc, ext] of [['br', '.br'], ['gzip', '.gz']]) {
        if (encodings.includes(enc) && accepted.includes(enc) && existsSync(file + ext)) {
          body = file + ext;
          out['Content-Encoding'] = enc;
          entry.encoding = enc;
          break;
        }
      }
    }
    for (const [name, value] of rulesFor().get(path) || []) out[name] = value;
    const st = statSync(body);
    const etag = `"${st.size.toString(16)}-${Math.floor(st.mtimeMs).toString(16)}${entry.encoding ? '-' + entry.encoding : ''}"`;
    out.ETag = etag;
    if (req.headers['if-none-match'] === etag) return send(304, '', out);
    out['Content-Length'] = st.size;
    send(200, readFileSync(body), out);
  });
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  const origin = `http://127.0.0.1:${server.address().port}`;
  return {
    origin,
    log,
    close: () => new Promise((ok) => { server.closeAllConnections?.(); server.close(() => ok()); }),
  };
}

/**
 * Copies `dist` under `subpath` of a fresh web root and serves it with dist/_headers applied
 * there (a course page's sub-path, as a deploy puts it); `close` also removes the web root.
 * @returns {Promise<{origin: string, url: string, root: string, log: object[], close: () => Promise<void>}>}
 */
export async function serveDist(dist, subpath, { precompressed = true, encodings = ['gzip'] } = {}) {
  const root = mkdtempSync(join(tmpdir(), 'trainmem-dist-'));
  mkdirSync(join(root, subpath), { recursive: true });
  cpSync(dist, join(root, subpath), { recursive: true });
  const server = await startServer({ root, precompressed, encodings, headers: true, headersBase: subpath });
  const close = async () => {
    await server.close();
    rmSync(root, { recursive: true, force: true });
  };
  return { ...server, url: server.origin + subpath, root, close };
}

// `node tests/browser/static-server.mjs ROOT [--gzip-only] [--port N]`: serve by hand (used by
// scripts/lighthouse.sh), precompressed and with _headers.
if (import.meta.url === `file://${process.argv[1]}`) {
  const root = process.argv[2];
  const gzipOnly = process.argv.includes('--gzip-only');
  const s = await startServer({ root, precompressed: true, encodings: gzipOnly ? ['gzip'] : ['br', 'gzip'], headers: true });
  console.log(s.origin);
}
