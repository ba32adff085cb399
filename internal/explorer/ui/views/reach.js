// The reach view: who can reach an endpoint and what it can reach, on a
// protocol and port or neither (AnalysisService.Reach, both directions;
// docs/analysis.md). Each direction is read in the answer's pages (at most
// 1000 entries each): the workloads by name, the same workloads grouped by
// the policies that allow them, and the classes outside the inventory; each
// entry links to the decide view of its flow.
//
// URL: ?view=reach&mesh=shop&end=workload:db-1&proto=TCP&port=5432
//      &topage=2&frompage=1   the page of each direction, from 1

import { h, table, field, errorBox, enumText, dash, tagList, tagsText } from '../dom.js';
import { forms, parseEnd, endpoint, formatEnd, query, decideHref } from '../ends.js';

const protocols = ['', 'TCP', 'UDP', 'ICMP'];

const directions = [
  { dir: 'to', api: 'REACH_DIRECTION_TO', pageKey: 'topage', title: (e) => `Who can reach ${e}` },
  { dir: 'from', api: 'REACH_DIRECTION_FROM', pageKey: 'frompage', title: (e) => `What ${e} can reach` },
];

export default {
  name: 'reach',
  title: 'Reach',
  claims: (params) => params.has('end'),
  async render(ctx) {
    const { params, root } = ctx;
    const q = readQuery(params);
    root.replaceChildren(h('h1', null, q.end ? `Reach of ${formatEnd(q.end)}` : 'Reach'), reachForm(q, ctx));
    const body = h('div', { id: 'reach-body', 'aria-live': 'polite' });
    root.append(body);
    if (q.error) {
      body.append(errorBox(q.error));
      return;
    }
    if (!q.end) {
      body.append(h('p', { class: 'hint' }, 'Name an endpoint: who can reach it and what it can reach appear here, both sides\' deciding policies for each peer.'));
      return;
    }
    ctx.setTitle(`Reach of ${formatEnd(q.end)}`);
    performance.mark('verdict:reach:start');
    const req = {
      mesh: q.mesh, type: q.type, endpoint: endpoint(q.end), protocol: q.proto, port: q.port ? Number(q.port) : 0,
    };
    const answers = await Promise.allSettled(directions.map((d) => ctx.api.page('verdict.v1.AnalysisService/Reach',
      { ...req, direction: d.api }, q.pages[d.dir] - 1)));
    if (ctx.stale()) return;
    for (const a of answers) {
      if (a.status === 'rejected' && a.reason?.status === 401) throw a.reason;
    }
    const first = answers.find((a) => a.status === 'fulfilled');
    if (first) body.append(resolved(q, first.value.body));
    body.append(h('p', null, h('a', { href: '#reach-to' }, directions[0].title(formatEnd(q.end))), ' · ',
      h('a', { href: '#reach-from' }, directions[1].title(formatEnd(q.end)))));
    body.append(h('div', { class: 'sides' }, directions.map((d, i) => direction(ctx, q, d, answers[i]))));
    performance.measure('verdict:reach', 'verdict:reach:start');
  },
};

function readQuery(params) {
  const q = {
    mesh: params.get('mesh') || '', type: params.get('type') || '',
    proto: (params.get('proto') || '').toUpperCase(), port: params.get('port') || '',
    end: null, pages: {},
  };
  try {
    for (const d of directions) {
      const n = Number(params.get(d.pageKey) || '1');
      if (!Number.isInteger(n) || n < 1) throw new Error(`${d.pageKey} "${params.get(d.pageKey)}": a page number from 1`);
      q.pages[d.dir] = n;
    }
    if (params.get('end')) q.end = parseEnd(params.get('end'));
    if (!protocols.includes(q.proto)) throw new Error(`proto "${q.proto}": TCP, UDP or ICMP`);
    if (q.port !== '') {
      const n = Number(q.port);
      if (!Number.isInteger(n) || n < 1 || n > 65535) throw new Error(`port "${q.port}": 1-65535`);
      if (!q.proto) throw new Error('a port needs its protocol (proto=TCP, UDP or ICMP)');
    }
  } catch (err) {
    q.error = err;
  }
  return q;
}

function reachForm(q, ctx) {
  const mesh = h('input', { id: 'reach-mesh', value: q.mesh, placeholder: 'default', autocomplete: 'off' });
  const type = h('input', { id: 'reach-type', value: q.type, placeholder: 'TrafficPermission', autocomplete: 'off' });
  const end = q.end || { form: 'workload', value: '' };
  const sel = h('select', { id: 'reach-form' }, forms.map((f) => h('option', { value: f.form, selected: f.form === end.form }, f.label)));
  const value = h('input', {
    id: 'reach-value', value: end.value, class: 'wide', autocomplete: 'off',
    placeholder: forms.find((f) => f.form === end.form).placeholder,
  });
  sel.addEventListener('change', () => { value.placeholder = forms.find((f) => f.form === sel.value).placeholder; });
  const proto = h('select', { id: 'reach-proto' }, protocols.map((p) => h('option', { value: p, selected: p === q.proto }, p || 'any')));
  const port = h('input', { id: 'reach-port', type: 'number', min: 1, max: 65535, value: q.port });
  return h('form', {
    class: 'query', 'aria-label': 'Endpoint', id: 'reach-query',
    onsubmit: (e) => {
      e.preventDefault();
      ctx.navigate(new URLSearchParams([['view', 'reach'], ['mesh', mesh.value.trim()], ['type', type.value.trim()],
        ['end', formatEnd({ form: sel.value, value: value.value.trim() })], ['proto', proto.value], ['port', port.value.trim()]]),
      { focus: true });
    },
  },
  field('Mesh', mesh), field('Type', type),
  h('fieldset', null, h('legend', null, 'Endpoint'), field('Endpoint given as', sel), field('Endpoint value', value)),
  field('Protocol', proto), field('Port', port),
  h('button', { type: 'submit', class: 'primary', id: 'reach-submit' }, 'Show reach'));
}

// resolved says how the endpoint resolved (the first page says), with a
// link to its workload.
function resolved(q, page) {
  const at = ` · ${q.proto ? `${q.proto}${q.port ? `/${q.port}` : ''}` : 'no protocol or port'} · revision ${dash(page.revision)}`;
  if (!page.endpoint) return h('p', { class: 'meta', id: 'reach-resolved' }, formatEnd(q.end), at);
  const res = page.endpoint;
  const form = enumText(res.form, 'ENDPOINT_FORM_').toLowerCase();
  const as = enumText(res.resolvedAs, 'RESOLVED_AS_').toLowerCase().replaceAll('_', ' ');
  return h('p', { class: 'meta', id: 'reach-resolved' },
    `${formatEnd(q.end)}: ${form} → ${as}`,
    res.workload ? [' ', h('a', { href: workloadHref(q, res.workload) }, res.workload)] : null,
    res.tags ? [' ', h('code', null, tagsText(res.tags))] : null, at);
}

const workloadHref = (q, name) => query([['view', 'workload'], ['mesh', q.mesh || 'default'], ['workload', name], ['type', q.type]]);

// direction is one direction's section: its page of entries, or its error.
function direction(ctx, q, d, answer) {
  const self = formatEnd(q.end);
  const title = d.title(self);
  const section = h('section', { id: `reach-${d.dir}`, 'aria-labelledby': `reach-${d.dir}-title` },
    h('h2', { id: `reach-${d.dir}-title` }, title));
  if (answer.status === 'rejected') {
    section.append(errorBox(answer.reason));
    return section;
  }
  const { body: page, pages } = answer.value;
  const entries = page.entries || [];
  const inside = entries.filter((e) => e.workload);
  const outside = entries.filter((e) => !e.workload);
  const n = q.pages[d.dir];
  section.append(h('p', { class: 'meta', id: `reach-${d.dir}-count` },
    `${inside.length} workload${inside.length === 1 ? '' : 's'}, ${outside.length} class${outside.length === 1 ? '' : 'es'} outside the inventory`,
    pages > 1 ? ` on page ${n} of ${pages}` : ''));
  // A flow between the endpoint and a peer, as the decide view takes it.
  const flowHref = (peer) => {
    if (!peer) return null;
    const [src, dst] = d.dir === 'to' ? [peer, self] : [self, peer];
    return decideHref({ mesh: q.mesh, type: q.type, src, dst, proto: q.proto, port: q.port });
  };
  const decideLink = (peer, name) => {
    const href = flowHref(peer);
    return href ? h('a', { href, 'aria-label': `decide ${d.dir === 'to' ? `${name} → ${self}` : `${self} → ${name}`}` }, 'decide') : '-';
  };
  if (pages > 1) section.append(pager(ctx, d, n, pages, 'above'));
  if (inside.length) section.append(groups(title, inside));
  if (outside.length) {
    section.append(table(`${title}: outside the inventory`, ['Peers', 'Outbound policy', 'Inbound policy', 'Flow'],
      outside.map((e) => {
        const c = outsideClass(e);
        return [c.text, sideText(e.outbound, e.outboundPolicy), sideText(e.inbound, e.inboundPolicy), decideLink(c.end, c.text)];
      }), { class: 'reach-outside' }));
  }
  if (inside.length) {
    section.append(table(`${title}: workloads`, ['Workload', 'Tags', 'Outbound policy', 'Inbound policy', 'Flow'],
      inside.map((e) => [h('a', { href: workloadHref(q, e.workload) }, e.workload), tagList(e.tags),
        sideText(e.outbound, e.outboundPolicy), sideText(e.inbound, e.inboundPolicy), decideLink(`workload:${e.workload}`, e.workload)]),
      { class: 'reach-workloads' }));
  }
  if (!entries.length) section.append(h('p', null, 'No peer is allowed.'));
  for (const note of page.notes || []) section.append(h('p', { class: 'hint' }, `Note: ${note}`));
  if (pages > 1) section.append(pager(ctx, d, n, pages, 'below'));
  return section;
}

// groups counts the page's workloads by the policies that allow them: the
// replicas of one service, which one policy lets in, are one line.
function groups(title, inside) {
  const byPolicies = new Map();
  for (const e of inside) {
    const k = `${sideText(e.outbound, e.outboundPolicy)}\u0000${sideText(e.inbound, e.inboundPolicy)}`;
    if (!byPolicies.has(k)) byPolicies.set(k, []);
    byPolicies.get(k).push(e.workload);
  }
  const rows = [...byPolicies].sort((a, b) => b[1].length - a[1].length).map(([k, names]) => {
    const [out, inb] = k.split('\u0000');
    const shown = names.slice(0, 8).join(', ') + (names.length > 8 ? `, and ${names.length - 8} more` : '');
    return [out, inb, String(names.length), shown];
  });
  return table(`${title}: grouped by the policies that allow them`, ['Outbound policy', 'Inbound policy', 'Workloads', 'Names'],
    rows, { class: 'reach-groups' });
}

// sideText is a side's deciding policy, or how it was decided without one.
function sideText(side, policy) {
  if (policy) return policy;
  return enumText(side?.reason, 'REASON_').toLowerCase().replaceAll('_', ' ');
}

// representative is an address of TEST-NET-1 (RFC 5737), which stands for
// "every address no workload holds" when a workload holds none of it.
const representative = '192.0.2.1';

// outsideClass reads an entry outside the inventory: its text, and an end
// that stands for it in a decide view.
function outsideClass(e) {
  if (e.any) return { text: 'any address outside the inventory', end: `address:${representative}` };
  if (e.cidr) return { text: `addresses ${e.cidr}`, end: `address:${e.cidr.split('/')[0]}` };
  if (e.principal) {
    const except = e.except?.length ? ` except ${e.except.join(', ')}` : '';
    const p = e.principal;
    let end = `principal:${p}`;
    if (p.endsWith('*/*')) end = `principal:${p.slice(0, -3)}example/path`;
    else if (p.endsWith('*')) end = `principal:${p.slice(0, -1)}example`;
    return { text: `principal ${p}${except}`, end };
  }
  return { text: 'outside the inventory', end: null };
}

function pager(ctx, d, n, pages, where) {
  const at = (k) => {
    const p = new URLSearchParams(ctx.params);
    p.set('view', 'reach');
    p.set(d.pageKey, String(k));
    return query(p);
  };
  return h('nav', { class: 'pager', 'aria-label': `Pages of ${d.dir === 'to' ? 'who can reach it' : 'what it can reach'}, ${where} the entries` },
    n > 1 ? h('a', { href: at(n - 1), rel: 'prev' }, 'Previous page') : null,
    h('span', null, ` page ${n} of ${pages} `),
    n < pages ? h('a', { href: at(n + 1), rel: 'next' }, 'Next page') : null);
}
