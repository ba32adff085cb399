// The explorer's router. Every view's state is in the URL's query: the page
// renders from location.search alone, links and forms push a new entry, and
// back and forward render the entry they return to.
//
// A view is one module of views/ added to the list below: an object with
//   name            the value of ?view= that selects it
//   title           its name in the navigation
//   claims(params)  true when the query, without ?view=, is this view's
//   render(ctx)     builds the view into ctx.root; resolves when it is done
// ctx gives params (URLSearchParams), root (the <main> element), api (api.js),
// navigate(params, {focus}) and stale() (a newer render has begun).

import { h, errorBox } from './dom.js';
import * as api from './api.js';
import { query } from './ends.js';
import decide from './views/decide.js';
import workload from './views/workload.js';
import reach from './views/reach.js';
import policies from './views/policies.js';
import impact from './views/impact.js';
import historyView from './views/history.js';

const views = [decide, workload, reach, policies, impact, historyView];

function pick(params) {
  const name = params.get('view');
  return views.find((v) => v.name === name) || views.find((v) => v.claims(params)) || views[0];
}

let generation = 0;

async function render(opts = {}) {
  const params = new URLSearchParams(location.search);
  const view = pick(params);
  const root = document.getElementById('main');
  const gen = ++generation;
  root.dataset.view = view.name;
  root.dataset.state = 'loading';
  root.setAttribute('aria-busy', 'true');
  showNav(view);
  showSession();
  const ctx = {
    params, root, api, navigate, focus: !!opts.focus,
    stale: () => gen !== generation,
    setTitle: (t) => { document.title = `${t} · verdict explorer`; },
  };
  try {
    ctx.setTitle(view.title);
    await view.render(ctx);
    if (ctx.stale()) return;
    root.dataset.state = 'ready';
  } catch (err) {
    if (ctx.stale()) return;
    if (err instanceof api.APIError && err.status === 401) {
      root.replaceChildren(tokenForm(err));
      root.dataset.state = 'token';
    } else {
      root.replaceChildren(h('h1', null, view.title), errorBox(err));
      root.dataset.state = 'error';
    }
  } finally {
    if (!ctx.stale()) root.removeAttribute('aria-busy');
  }
}

// navigate shows the view of params as a new history entry.
function navigate(params, opts = {}) {
  const url = query(params);
  if (url === (location.search || '?')) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  render(opts);
}

function showNav(current) {
  const nav = document.getElementById('views');
  // The mesh in view goes along to the other views.
  const mesh = new URLSearchParams(location.search).get('mesh');
  nav.replaceChildren(...views.map((v) => h('a', {
    href: query([['view', v.name], ['mesh', mesh || '']]), 'aria-current': v === current ? 'page' : null,
  }, v.title)));
}

function showSession() {
  const el = document.getElementById('session');
  if (!api.token()) {
    el.replaceChildren();
    return;
  }
  el.replaceChildren(h('span', null, 'token set'), h('button', {
    type: 'button', id: 'forget-token',
    onclick: () => { api.clearToken(); render(); },
  }, 'Forget token'));
}

// tokenForm asks for the bearer token verdictd was started with.
function tokenForm(err) {
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, class: 'wide' });
  const form = h('form', {
    class: 'query', 'aria-labelledby': 'token-title',
    onsubmit: (e) => {
      e.preventDefault();
      api.setToken(input.value.trim());
      render({ focus: true });
    },
  }, h('div', { class: 'field' }, h('label', { for: 'token' }, 'Bearer token'), input),
  h('button', { type: 'submit', class: 'primary', id: 'token-submit' }, 'Use token'));
  queueMicrotask(() => input.focus());
  return h('section', null,
    h('h1', { id: 'token-title' }, 'This explorer needs a token'),
    h('p', null, 'verdictd runs with authorization: give the token of its --auth-token-file. ',
      'It is kept in this tab only (sessionStorage) and sent with each call.'),
    api.token() ? errorBox(err) : null,
    form);
}

// Links to this page change the view without a reload.
document.addEventListener('click', (e) => {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = e.target.closest('a[href]');
  if (!a || a.getAttribute('href').startsWith('#')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname !== '/') return;
  e.preventDefault();
  navigate(new URLSearchParams(url.search), { focus: true });
});

window.addEventListener('popstate', () => render());
render();
