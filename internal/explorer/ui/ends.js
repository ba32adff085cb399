// The ends of a flow in the page's URL: workload:NAME, address:IP,
// principal:ID or tags:k=v,k2=v2 (docs/explorer.md).

export const forms = [
  { form: 'workload', label: 'Workload', placeholder: 'web-1' },
  { form: 'address', label: 'Address', placeholder: '10.0.0.1' },
  { form: 'principal', label: 'Principal', placeholder: 'spiffe://shop/web' },
  { form: 'tags', label: 'Tags', placeholder: 'app=web,env=prod' },
];

// parseEnd reads "form:value" (the first colon separates them: a principal
// or an IPv6 address keeps its own). Returns {form, value}, or throws.
export function parseEnd(s) {
  const i = s.indexOf(':');
  const form = i < 0 ? '' : s.slice(0, i);
  if (!forms.some((f) => f.form === form)) {
    throw new Error(`"${s}": an end is workload:NAME, address:IP, principal:ID or tags:k=v,k2=v2`);
  }
  const value = s.slice(i + 1);
  if (form !== 'tags' && value === '') throw new Error(`"${s}": the ${form} is empty`);
  if (form === 'tags') parseTags(value);
  return { form, value };
}

// parseTags reads "k=v,k2=v2" (the first = of a pair separates key and
// value); "" is no tags.
export function parseTags(s) {
  const tags = {};
  if (s.trim() === '') return tags;
  for (const pair of s.split(',')) {
    const i = pair.indexOf('=');
    if (i <= 0) throw new Error(`tags "${s}": "${pair}" is not k=v`);
    tags[pair.slice(0, i).trim()] = pair.slice(i + 1).trim();
  }
  return tags;
}

// endpoint is the API's Endpoint of an end.
export function endpoint({ form, value }) {
  return form === 'tags' ? { tags: parseTags(value) } : { [form]: value };
}

export const formatEnd = ({ form, value }) => `${form}:${value}`;

// query writes URL parameters readably: only what a query value needs is
// escaped (":", ",", "=" and "/" stay as they are).
export function query(params) {
  const parts = [];
  for (const [k, v] of params) {
    if (v === '' || v == null) continue;
    const enc = encodeURIComponent(v).replace(/%3A/gi, ':').replace(/%2C/gi, ',').replace(/%3D/gi, '=').replace(/%2F/gi, '/');
    parts.push(`${encodeURIComponent(k)}=${enc}`);
  }
  return parts.length ? `?${parts.join('&')}` : '?';
}

// tagsEnd is the URL end of a tag set ("tags:app=web,env=prod"), or '' when
// a key or value holds a "," or a key a "=", which the tags form cannot write.
export function tagsEnd(tags) {
  const keys = Object.keys(tags || {}).sort();
  if (keys.some((k) => k.includes(',') || k.includes('=') || String(tags[k]).includes(','))) return '';
  return `tags:${keys.map((k) => `${k}=${tags[k]}`).join(',')}`;
}

// endOf is the URL end of the API's Endpoint, or '' when it has none (an
// identity).
export function endOf(ep) {
  if (!ep) return '';
  for (const form of ['workload', 'address', 'principal']) {
    if (ep[form]) return `${form}:${ep[form]}`;
  }
  if (ep.identity && ep.identity !== '0') return '';
  return tagsEnd(ep.tags);
}

// decideHref is the decide view of a flow: {mesh, type, src, dst, proto,
// port, rev}, empty values left out.
export function decideHref(f) {
  return query([['mesh', f.mesh], ['type', f.type], ['src', f.src], ['dst', f.dst], ['proto', f.proto || ''],
    ['port', f.proto && f.port ? String(f.port) : ''], ['rev', f.rev || '']]);
}
