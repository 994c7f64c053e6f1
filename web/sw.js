// trainmem's service worker: the app works offline after one visit, and updates cleanly.
//
// - Install precaches every file of this build (the page, its content-hashed modules, the
//   lazily loaded benchmark, the styles, the manifest and icons), all or nothing, into a cache
//   named for this scope and this build. The page itself is checked to be this build's page
//   (its <meta name="trainmem-build">), so a deploy landing mid-install cannot mix two builds.
// - Requests inside the scope are served cache-first: this build's cache, then the previous
//   build's (a tab still open on it may load its benchmark module later), then the network.
//   Navigations to the app (./ or ./index.html, any query: the query is the configuration)
//   get the cached page; other pages under the scope (e.g. ./v0.2.0/, an older release with a
//   service worker of its own) go to the network untouched.
// - Updates: a new deploy changes this file (its build id and file list), so the browser
//   installs the new worker next to the running one. It waits; the page shows an "updated —
//   reload" notice, and Reload asks it to take over (SKIP_WAITING). If the notice is ignored,
//   the next load activates it: a navigation with a waiting worker and no other tab open asks it
//   to take over and reloads at once (an empty response with Refresh: 0). Until the new worker
//   has begun to take over (at most HANDOVER_RETRY_MS), each reload that still reaches this one
//   reloads again: the new worker may need a moment to start, and showing the old build then
//   would leave the page on it after the handover.
// - Activation deletes this scope's caches older than the previous build; other scopes (other
//   versions of the app on the same origin) are never touched.
//
// scripts/dist.py fills in BUILD, PRECACHE and REVALIDATE; this file is served with no-cache.
'use strict';

/** This build's id: a digest of every precached file. */
const BUILD = '__BUILD__';
/** Every file of the build, relative to this script ('./' is the page). */
const PRECACHE = __PRECACHE__;
/** Files whose names carry no content hash: fetched past the HTTP cache when precaching. */
const REVALIDATE = __REVALIDATE__;

const SCOPE = self.registration.scope;
const PREFIX = 'trainmem ' + SCOPE + ' ';
const CACHE = PREFIX + BUILD;
const PAGE = new URL('./', self.location).href;
const PAGE_FILE = new URL('./index.html', self.location).href;
/** How long after asking a waiting worker to take over a navigation is served normally. */
const HANDOVER_GRACE_MS = 10000;
/** How long after asking, a navigation that still reaches this worker reloads again. */
const HANDOVER_RETRY_MS = 3000;
let handoverAt = 0;

const absolute = (path) => new URL(path, self.location).href;

self.addEventListener('install', (event) => {
  event.waitUntil(
    (async () => {
      const cache = await caches.open(CACHE);
      await Promise.all(
        PRECACHE.map(async (path) => {
          const url = absolute(path);
          const response = await fetch(url, { cache: REVALIDATE.includes(path) ? 'no-cache' : 'default' });
          if (!response.ok) throw new Error(`precache ${path}: HTTP ${response.status}`);
          if (url === PAGE) {
            const html = await response.clone().text();
            if (!html.includes(`<meta name="trainmem-build" content="${BUILD}"`)) {
              throw new Error('precache: the page is not from this build (a deploy is under way)');
            }
          }
          await cache.put(url, response);
        }),
      );
    })(),
  );
});

self.addEventListener('activate', (event) => {
  event.waitUntil(
    (async () => {
      // Keep this build's cache and the one before it (by creation order); drop older ones.
      const ours = (await caches.keys()).filter((k) => k.startsWith(PREFIX));
      const keep = new Set([CACHE, ...ours.filter((k) => k !== CACHE).slice(-1)]);
      await Promise.all(ours.filter((k) => !keep.has(k)).map((k) => caches.delete(k)));
      await self.clients.claim();
    })(),
  );
});

self.addEventListener('message', (event) => {
  if (event.data && event.data.type === 'SKIP_WAITING') self.skipWaiting();
  if (event.data && event.data.type === 'BUILD') event.source?.postMessage({ type: 'BUILD', build: BUILD, precache: PRECACHE.length });
});

/** The newest cached response for a URL in this scope's caches, newest build first. */
async function lookup(url) {
  const hit = await caches.open(CACHE).then((c) => c.match(url));
  if (hit) return hit;
  const older = (await caches.keys()).filter((k) => k.startsWith(PREFIX) && k !== CACHE).reverse();
  for (const key of older) {
    const r = await caches.open(key).then((c) => c.match(url));
    if (r) return r;
  }
  return undefined;
}

/** An empty page that reloads at once. */
const reloadNow = () => new Response('', { headers: { Refresh: '0', 'Content-Type': 'text/html; charset=utf-8' } });

async function navigate(request) {
  const waiting = self.registration.waiting;
  if (waiting) {
    const since = Date.now() - handoverAt;
    if (since < HANDOVER_RETRY_MS) return reloadNow();
    if (since > HANDOVER_GRACE_MS) {
      const tabs = await self.clients.matchAll({ type: 'window' });
      if (tabs.length < 2) {
        handoverAt = Date.now();
        waiting.postMessage({ type: 'SKIP_WAITING' });
        return reloadNow();
      }
    }
  }
  return (await lookup(PAGE)) || fetch(request);
}

self.addEventListener('fetch', (event) => {
  const request = event.request;
  if (request.method !== 'GET' || !request.url.startsWith(SCOPE)) return;
  const url = new URL(request.url);
  const path = url.origin + url.pathname;
  if (request.mode === 'navigate') {
    if (path === PAGE || path === PAGE_FILE) event.respondWith(navigate(request));
    return;
  }
  // Only this build's files (and the previous build's) are answered from the caches; anything
  // else under the scope (another version's files) goes to the network as if no worker ran.
  event.respondWith(lookup(path === PAGE_FILE ? PAGE : request.url).then((hit) => hit || fetch(request)));
});
