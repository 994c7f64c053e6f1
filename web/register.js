// Registers trainmem's service worker (web/sw.js) after the page has loaded, and offers a new
// deploy: when a new worker has installed next to the running one, an "updated" notice (a
// polite live region with a Reload button) appears; Reload asks the new worker to take over and
// reloads once it has. Injected inline into index.html by scripts/dist.py (its hash is pinned in
// the CSP by scripts/csp.py).
(() => {
  if (!('serviceWorker' in navigator)) return;
  const sw = navigator.serviceWorker;
  let reloadWanted = false;

  function notice(worker) {
    if (document.querySelector('[data-testid=update-notice]')) return;
    const box = document.createElement('div');
    box.setAttribute('role', 'status');
    box.setAttribute('aria-live', 'polite');
    box.dataset.testid = 'update-notice';
    box.style.cssText =
      'position:fixed;left:50%;bottom:16px;transform:translateX(-50%);z-index:1000;display:flex;gap:12px;align-items:center;' +
      'max-width:calc(100vw - 32px);padding:10px 14px;border-radius:8px;font:inherit;' +
      'background:var(--panel,#fff);color:var(--fg,#1c1c20);border:2px solid var(--accent,#0a62a8);box-shadow:0 4px 16px rgba(0,0,0,.25)';
    document.body.appendChild(box);
    // Filled in after insertion, so that screen readers announce it.
    requestAnimationFrame(() => {
      const text = document.createElement('span');
      text.textContent = 'trainmem has been updated.';
      const button = (label, testid, onClick) => {
        const b = document.createElement('button');
        b.type = 'button';
        b.textContent = label;
        b.dataset.testid = testid;
        b.style.cssText = 'font:inherit;padding:4px 12px;border-radius:6px;cursor:pointer';
        b.addEventListener('click', onClick);
        return b;
      };
      const reload = button('Reload', 'update-reload', () => {
        reloadWanted = true;
        worker.postMessage({ type: 'SKIP_WAITING' });
      });
      reload.style.cssText += ';background:var(--accent,#0a62a8);color:var(--accent-fg,#fff);border:0';
      const later = button('Later', 'update-later', () => box.remove());
      later.style.cssText += ';background:transparent;color:inherit;border:1px solid currentColor';
      box.append(text, reload, later);
    });
  }

  // The new worker took over because this page asked: show the new build.
  sw.addEventListener('controllerchange', () => {
    if (reloadWanted) {
      reloadWanted = false;
      location.reload();
    }
  });

  addEventListener('load', () => {
    sw.register('./sw.js', { updateViaCache: 'none' })
      .then((reg) => {
        const offer = (worker) => {
          if (worker && sw.controller) notice(worker);
        };
        offer(reg.waiting);
        reg.addEventListener('updatefound', () => {
          const worker = reg.installing;
          worker?.addEventListener('statechange', () => {
            if (worker.state === 'installed') offer(worker);
          });
        });
        // A tab left open (a classroom, a lecture) looks for a new deploy when shown again.
        document.addEventListener('visibilitychange', () => {
          if (document.visibilityState === 'visible') reg.update().catch(() => {});
        });
      })
      .catch((e) => console.warn('trainmem: offline use unavailable:', e));
  });
})();
