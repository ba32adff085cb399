// The workload view: a workload's tags, addresses and principal, its rules
// on both sides in decision order (the lists WatchRules sends its firewall
// agent), and links to decide views from and to it. Without a workload, the
// workloads of the mesh.
//
// URL: ?view=workload&mesh=shop&workload=web-1&type=TrafficPermission

import { h, table, field, errorBox, enumText, action, dash, tagList } from '../dom.js';
import { query } from '../ends.js';

export default {
  name: 'workload',
  title: 'Workloads',
  claims: (params) => params.has('workload'),
  async render(ctx) {
    const { params, root } = ctx;
    const mesh = params.get('mesh') || 'default';
    const name = params.get('workload') || '';
    const type = params.get('type') || '';
    root.replaceChildren(h('h1', null, name ? `Workload ${name}` : `Workloads of mesh ${mesh}`), pickForm(mesh, name, type, ctx));
    const body = h('div', { id: 'workload-body', 'aria-live': 'polite' });
    root.append(body);
    if (!name) {
      await listWorkloads(ctx, body, mesh, type);
      return;
    }
    ctx.setTitle(`Workload ${name}`);
    performance.mark('verdict:workload:start');
    const calls = [
      ctx.api.call('verdict.v1.PolicyService/Get', { key: `${mesh}/workloads/${name}` }),
      ctx.api.call('verdict.v1.WatchService/WatchRules', { mesh, type, workload: { workload: name }, includeAudit: true }),
      ctx.api.call('verdict.v1.PolicyService/List', { prefix: `${mesh}/workloads/`, pageSize: 1000 }),
    ];
    const [got, rules, others] = await Promise.allSettled(calls);
    if (ctx.stale()) return;
    for (const r of [got, rules, others]) {
      if (r.status === 'rejected' && r.reason?.status === 401) throw r.reason;
    }
    if (got.status === 'rejected') {
      body.append(errorBox(got.reason));
      return;
    }
    body.append(facts(got.value.resource, mesh));
    body.append(flowLinks(mesh, name, type, others.status === 'fulfilled' ? others.value.resources || [] : []));
    if (rules.status === 'rejected') body.append(errorBox(rules.reason));
    else body.append(reachLinks(mesh, name, type, rules.value), ruleLists(mesh, name, type, rules.value));
    performance.measure('verdict:workload', 'verdict:workload:start');
  },
};

function pickForm(mesh, name, type, ctx) {
  const meshIn = h('input', { id: 'wl-mesh', value: mesh, autocomplete: 'off' });
  const nameIn = h('input', { id: 'wl-name', value: name, autocomplete: 'off', placeholder: 'all workloads' });
  const typeIn = h('input', { id: 'wl-type', value: type, autocomplete: 'off', placeholder: 'TrafficPermission' });
  return h('form', {
    class: 'query', 'aria-label': 'Workload', id: 'workload-form',
    onsubmit: (e) => {
      e.preventDefault();
      ctx.navigate(new URLSearchParams({ view: 'workload', mesh: meshIn.value.trim(), workload: nameIn.value.trim(), type: typeIn.value.trim() }),
        { focus: true });
    },
  }, field('Mesh', meshIn), field('Workload', nameIn), field('Policy type', typeIn),
  h('button', { type: 'submit', class: 'primary', id: 'workload-submit' }, 'Show'));
}

const workloadHref = (mesh, name, type) => query([['view', 'workload'], ['mesh', mesh], ['workload', name], ['type', type]]);

async function listWorkloads(ctx, body, mesh, type) {
  let resp;
  try {
    resp = await ctx.api.call('verdict.v1.PolicyService/List', { prefix: `${mesh}/workloads/`, pageSize: 1000 });
  } catch (err) {
    if (err.status === 401 || ctx.stale()) throw err;
    body.append(errorBox(err));
    return;
  }
  if (ctx.stale()) return;
  const rows = (resp.resources || []).map((s) => {
    const w = s.resource?.workload || {};
    return [h('a', { href: workloadHref(mesh, w.name || s.key, type) }, w.name || s.key), tagList(w.tags),
      (w.addresses || []).join(', ') || '-', dash(w.principal), s.error ? h('span', { class: 'act-deny' }, s.error) : '-'];
  });
  body.append(rows.length
    ? table(`Workloads of mesh ${mesh}`, ['Name', 'Tags', 'Addresses', 'Principal', 'Error'], rows, { id: 'workloads' })
    : h('p', null, `Mesh ${mesh} has no workload.`));
  if (resp.nextPageToken) body.append(h('p', { class: 'hint' }, 'The first 1000 workloads are listed.'));
}

function facts(stored, mesh) {
  const w = stored?.resource?.workload || {};
  const ports = (w.ports || []).map((p) => h('div', null, `${p.port}: `, tagList(p.tags)));
  return h('section', { 'aria-labelledby': 'facts-title' },
    h('h2', { id: 'facts-title' }, 'Facts'),
    h('dl', { class: 'facts', id: 'workload-facts' },
      h('dt', null, 'Mesh'), h('dd', null, mesh),
      h('dt', null, 'Tags'), h('dd', { id: 'workload-tags' }, tagList(w.tags)),
      h('dt', null, 'Addresses'), h('dd', { id: 'workload-addresses' }, (w.addresses || []).join(', ') || '-'),
      h('dt', null, 'Principal'), h('dd', { id: 'workload-principal' }, dash(w.principal)),
      h('dt', null, 'Port tags'), h('dd', null, ports.length ? ports : '-'),
      h('dt', null, 'Identity'), h('dd', { class: 'mono' }, dash(stored?.identity)),
      h('dt', null, 'Revision'), h('dd', null, `modified at ${dash(stored?.modRevision)}`),
      stored?.error ? [h('dt', null, 'Error'), h('dd', { class: 'act-deny' }, stored.error)] : null));
}

const decideHref = (mesh, type, src, dst, proto, port) =>
  query([['mesh', mesh], ['type', type], ['src', src], ['dst', dst], ['proto', proto || ''], ['port', port || '']]);

// flowLinks: decide views from and to the workload, one per other workload.
function flowLinks(mesh, name, type, others) {
  const self = `workload:${name}`;
  const names = others.map((s) => s.resource?.workload?.name).filter((n) => n && n !== name).slice(0, 200);
  return h('section', { 'aria-labelledby': 'links-title' },
    h('h2', { id: 'links-title' }, 'Decide flows'),
    h('p', null, h('a', { href: decideHref(mesh, type, self, ''), id: 'decide-from' }, `from ${name}…`), ' · ',
      h('a', { href: decideHref(mesh, type, '', self), id: 'decide-to' }, `to ${name}…`)),
    names.length ? h('ul', { class: 'links', id: 'peer-links' }, names.map((n) => h('li', null,
      h('a', { href: decideHref(mesh, type, self, `workload:${n}`) }, `${name} → ${n}`), ' · ',
      h('a', { href: decideHref(mesh, type, `workload:${n}`, self) }, `${n} → ${name}`)))) : null);
}

function ruleLists(mesh, name, type, resp) {
  return h('section', { 'aria-labelledby': 'rules-title' },
    h('h2', { id: 'rules-title' }, `Rules of ${type || 'TrafficPermission'}, in decision order`),
    h('p', { class: 'meta' }, `revision ${dash(resp.revision)}`),
    h('div', { class: 'sides' },
      sideRules('inbound', `Inbound: flows to ${name}`, mesh, name, type, resp.inbound),
      sideRules('outbound', `Outbound: flows from ${name}`, mesh, name, type, resp.outbound)));
}

function sideRules(side, caption, mesh, name, type, s) {
  s = s || {};
  const policyCell = (r) => (r.policy
    ? h('a', { href: query([['view', 'policies'], ['mesh', mesh], ['policy', `${type || 'TrafficPermission'}/${r.policy}`]]) }, h('code', null, r.policy))
    : '-');
  const rows = (s.rules || []).map((r, i) => [String(i + 1), policyCell(r), dash(r.scope), dash(r.phase),
    String(r.priority || 0), h('code', null, dash(r.rule)), peerText(r.peer), portsText(r.ports), action(r.action, r.audit),
    ruleFlowLink(side, mesh, name, type, r)]);
  return h('div', { id: `rules-${side}` },
    table(caption, ['#', 'Policy', 'Scope', 'Phase', 'Prio', 'Rule', 'Peer', 'Ports', 'Action', 'Flow'], rows, { class: 'rules' }),
    h('p', { class: 'hint' }, `No rule matches: `, action(s.fallback), ` (${enumText(s.fallbackReason, 'REASON_')})`,
      s.combine ? `; rules combine by ${s.combine}` : ''));
}

function selectorText(sel) {
  const parts = Object.keys(sel.match || {}).sort().map((k) => `${k}=${sel.match[k]}`);
  for (const e of sel.expressions || []) parts.push(`${e.key} ${e.operator}${e.values?.length ? ` (${e.values.join(', ')})` : ''}`);
  return parts.length ? parts.join(', ') : 'any workload';
}

const peerText = (peer) => (peer?.length ? peer.map(selectorText).join(' or ') : 'any workload');

function portsText(ports) {
  if (!ports?.length) return 'all traffic';
  return ports.map((p) => `${p.protocol || 'ANY'}${p.ports ? ` ${p.ports}` : ''}`).join('; ');
}

// ruleFlowLink decides a flow the rule stands for, when its peer is one set
// of exact tags: that peer, on the rule's first protocol and port.
function ruleFlowLink(side, mesh, name, type, r) {
  const sel = r.peer?.[0];
  if (r.peer?.length > 1 || sel?.expressions?.length) return '-';
  const match = sel?.match || {};
  if (Object.values(match).some((v) => v.includes('*'))) return '-';
  const peer = `tags:${Object.keys(match).sort().map((k) => `${k}=${match[k]}`).join(',')}`;
  const p = r.ports?.[0];
  const proto = p && p.protocol && p.protocol !== 'ANY' ? p.protocol : '';
  const port = proto && p.ports ? p.ports.split(',')[0].split('-')[0].trim() : '';
  const self = `workload:${name}`;
  const [src, dst] = side === 'inbound' ? [peer, self] : [self, peer];
  return h('a', { href: decideHref(mesh, type, src, dst, proto, port), 'aria-label': `decide rule ${r.rule} of ${r.policy || 'the catch-all'}` },
    'decide');
}

// reachLinks: who can reach the workload and what it can reach (the reach
// view), with no protocol or port, and on each protocol and first port its
// rules name.
function reachLinks(mesh, name, type, resp) {
  const classes = new Map([['', ['', '']]]);
  for (const side of [resp.inbound, resp.outbound]) {
    for (const r of side?.rules || []) {
      for (const p of r.ports || []) {
        if (!p.protocol || p.protocol === 'ANY') continue;
        const port = p.ports ? p.ports.split(',')[0].split('-')[0].trim() : '';
        classes.set(`${p.protocol} ${port}`.trim(), [p.protocol, port]);
      }
    }
  }
  const href = ([proto, port]) => query([['view', 'reach'], ['mesh', mesh], ['type', type], ['end', `workload:${name}`],
    ['proto', proto], ['port', port]]);
  return h('section', { 'aria-labelledby': 'reach-title' },
    h('h2', { id: 'reach-title' }, 'Who can reach it, what it can reach'),
    h('ul', { class: 'links', id: 'reach-links' }, [...classes].slice(0, 20).map(([text, c]) => h('li', null,
      h('a', { href: href(c) }, text ? `on ${text}` : 'with no protocol or port')))));
}
