/*
 * `gpuwire-hook ldcache ...` in C: the CDI hook's links and ld cache without Python.
 *
 * Every CDI GPU start runs this hook. Served by the resident it still costs ~4 ms of a
 * forked Python's work on every start (its copy-on-write faults alone ~1.3 ms); this does the
 * same in well under a millisecond. It does exactly what `runtime_hook.start.hook.ldcache` does
 * in the common case, and nothing where that case does not hold: then it declines, having
 * changed nothing, and gpuwire-call goes on to the resident and the Python hook as before
 * (with the OCI state handed on in a memfd as stdin), which do the rest and name what is wrong:
 *
 * - the arguments as `gpuwire.edits.parse_ldcache_args` takes them (anything else: declined);
 * - the OCI state's `pid` and `bundle`, the bundle's `config.json` `root.path`, read as
 *   strictly as Python's json reads them (anything it would refuse: declined);
 * - in a child that joins the container's mount namespace (unless it is there already: a
 *   `createContainer` hook), the root opened, every path in it resolved by openat2 with
 *   RESOLVE_IN_ROOT (a link in the image resolves as it would in the container, never to the
 *   host), the links' directories and /etc only where they exist (making them is declined);
 * - each link made or an image's link replaced, undone if a later step declines; a real file
 *   of the image's where a link goes is left to ldconfig (declined);
 * - then, as ldcache.make does (a link may be what the cache's path leads to), the image's
 *   cache read and the entries put in, byte for byte as `gpuwire.ldsocache` writes them (the
 *   same sort, string table and extension directory; whatever it raises CacheFormatError for,
 *   or no `--entry` for the folders, is declined);
 * - the cache replaced by a temporary file and a rename in the root's /etc, only if it differs.
 *
 * Nothing is executed and no environment is read. The configured ldconfig is only checked,
 * as the Python hook checks it (a static ELF file; else declined, and the Python names it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/openat2.h>

#include "ldcache.h"

/* Only gpuwire-call's `gpuwire-hook` mode (HOOK_CODE) calls this, and the install compiles
 * in what must be the Python's: the generator string the cache is signed with, the largest
 * cache and the most entries it reads (launcher.hook_defines). Names and paths in a cache are
 * at most Linux's NAME_MAX and PATH_MAX, as ldsocache reads them. */
#ifdef HOOK_CODE
#define MAX_CONFIG (16 << 20) /* config.json */
#define MAX_ITEMS 4096	     /* links, folders, entries */
#define DONE 0
#define DECLINED 3

#define IN_ROOT (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
#define EXACT (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

typedef struct {
	const unsigned char *p;
	size_t n;
} bytes;

static int openat2_(int dir, const char *path, int flags, mode_t mode, unsigned long long how)
{
	struct open_how spec = {.flags = (unsigned long long)(flags | O_CLOEXEC),
				.mode = mode,
				.resolve = how};
	return (int)syscall(SYS_openat2, dir, path, &spec, sizeof(spec));
}

/* `path` as the root sees it: hook.ldcache's `resolve.lookup` */
static int lookup(int root, const char *path, int flags)
{
	while (*path == '/')
		path++;
	return openat2_(root, *path ? path : ".", flags, 0, IN_ROOT);
}

/* -- JSON: strict as Python's json (lightjson), read only for a few members -------------
 * A document json would refuse is declined; of a member named twice the last counts, as in
 * the dict json makes. */

typedef struct {
	const char *at, *end;
	int depth;
} json;

static void space(json *j)
{
	while (j->at < j->end && (*j->at == ' ' || *j->at == '\t' || *j->at == '\n' || *j->at == '\r'))
		j->at++;
}

static int hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* a string (json's strict scanner: no control characters, only its escapes); decoded into
 * `out` (malloc'd, NUL-ended) when given, where a \u escape is declined (-1) */
static int string(json *j, char **out)
{
	if (j->at >= j->end || *j->at != '"')
		return -1;
	const char *start = ++j->at;
	int unicode = 0;
	for (; j->at < j->end && *j->at != '"'; j->at++) {
		if ((unsigned char)*j->at < 0x20)
			return -1;
		if (*j->at != '\\')
			continue;
		if (++j->at >= j->end || !strchr("\"\\/bfnrtu", *j->at) || !*j->at)
			return -1;
		if (*j->at == 'u') {
			if (j->end - j->at < 5 || !hex(j->at[1]) || !hex(j->at[2]) || !hex(j->at[3]) ||
			    !hex(j->at[4]))
				return -1;
			unicode = 1;
			j->at += 4;
		}
	}
	if (j->at >= j->end)
		return -1;
	const char *stop = j->at++;
	if (out == NULL)
		return 0;
	char *decoded = unicode ? NULL : malloc((size_t)(stop - start) + 1), *w = decoded;
	if (decoded == NULL)
		return -1;
	for (const char *r = start; r < stop; r++) {
		static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
		*w++ = *r == '\\' ? to[strchr(from, *++r) - from] : *r;
	}
	*w = '\0';
	*out = decoded;
	return 0;
}

static int digits(json *j)
{
	const char *start = j->at;
	while (j->at < j->end && *j->at >= '0' && *j->at <= '9')
		j->at++;
	return j->at > start ? 0 : -1;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?; an integer of more digits than Python
 * converts (sys.get_int_max_str_digits(), 4300 unless set: -I keeps PYTHONINTMAXSTRDIGITS
 * out) is refused as json refuses it */
static int number(json *j)
{
	if (j->at < j->end && *j->at == '-')
		j->at++;
	const char *start = j->at;
	if (j->at < j->end && *j->at == '0')
		j->at++;
	else if (digits(j))
		return -1;
	int integer = j->at - start;
	if (j->at < j->end && *j->at == '.' && (j->at++, integer = 0, digits(j)))
		return -1;
	if (j->at < j->end && (*j->at == 'e' || *j->at == 'E')) {
		j->at++;
		if (j->at < j->end && (*j->at == '-' || *j->at == '+'))
			j->at++;
		return digits(j);
	}
	return integer > 4300 ? -1 : 0;
}

static int value(json *j);

static int members(json *j, char close)
{
	int object = close == '}';
	if (++j->depth > 64)
		return -1;
	j->at++;
	space(j);
	if (j->at < j->end && *j->at == close) {
		j->at++;
		j->depth--;
		return 0;
	}
	for (;;) {
		space(j);
		if (object) {
			if (string(j, NULL))
				return -1;
			space(j);
			if (j->at >= j->end || *j->at++ != ':')
				return -1;
		}
		if (value(j))
			return -1;
		space(j);
		if (j->at < j->end && *j->at == ',') {
			j->at++;
			continue;
		}
		if (j->at < j->end && *j->at == close) {
			j->at++;
			j->depth--;
			return 0;
		}
		return -1;
	}
}

/* skips one value */
static int value(json *j)
{
	space(j);
	if (j->at >= j->end)
		return -1;
	static const char *const literals[] = {"true", "false", "null"};
	switch (*j->at) {
	case '"':
		return string(j, NULL);
	case '{':
		return members(j, '}');
	case '[':
		return members(j, ']');
	}
	for (int i = 0; i < 3; i++) {
		size_t n = strlen(literals[i]);
		if ((size_t)(j->end - j->at) >= n && !memcmp(j->at, literals[i], n)) {
			j->at += n;
			return 0;
		}
	}
	return number(j);
}

/* in the (checked) object at j->at, the value of the last member named `key` (j->at set
 * to it); 1: none */
static int member(json *j, const char *key)
{
	const char *found = NULL;
	space(j);
	j->at++;
	space(j);
	while (j->at < j->end && *j->at != '}') {
		char *name = NULL;
		if (string(j, &name)) /* a name spelled with \u could be `key`: declined */
			return -1;
		int same = strcmp(name, key) == 0;
		free(name);
		space(j);
		j->at++; /* ':' */
		space(j);
		if (same)
			found = j->at;
		if (value(j))
			return -1;
		space(j);
		if (j->at < j->end && *j->at == ',')
			j->at++;
		space(j);
	}
	if (found == NULL)
		return 1;
	j->at = found;
	return 0;
}

/* one UTF-8 sequence at `p` (what Python's decode accepts): its length, 0 if invalid */
static size_t utf8(const unsigned char *p, const unsigned char *end)
{
	if (*p < 0x80)
		return 1;
	size_t n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : 2;
	unsigned min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
	if (*p < 0xc2 || *p > 0xf4 || (size_t)(end - p) < n)
		return 0;
	unsigned code = *p & (0x7f >> n);
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		code = code << 6 | (p[i] & 0x3f);
	}
	return code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) ? 0 : n;
}

/* the whole text must be one JSON object, as json reads it: a member found in anything
 * else would be a guess */
static int object(const char *text, size_t size, json *j)
{
	const unsigned char *p = (const unsigned char *)text, *end = p + size;
	for (size_t n; p < end; p += n)
		if ((n = utf8(p, end)) == 0)
			return -1;
	*j = (json){.at = text, .end = text + size};
	space(j);
	json check = *j;
	if (j->at >= j->end || *j->at != '{' || value(&check))
		return -1;
	space(&check);
	return check.at == check.end ? 0 : -1;
}

static char *read_all(int fd, size_t limit, size_t *size)
{
	size_t used = 0, room = limit < 65536 ? limit : 65536;
	char *data = malloc(room);
	while (data != NULL) {
		if (used == room) {
			size_t grown = room * 2 < limit ? room * 2 : limit;
			char *more = room < limit ? realloc(data, grown) : NULL;
			if (more == NULL)
				break;
			data = more;
			room = grown;
		}
		ssize_t got = read(fd, data + used, room - used);
		if (got == 0) {
			*size = used;
			return data;
		}
		if (got < 0 && errno != EINTR)
			break;
		used += got > 0 ? (size_t)got : 0;
	}
	free(data);
	return NULL;
}

/* whether `path` has a `.` or `..` component, where the kernel's walk and normpath differ */
static int has_dots(const char *path)
{
	for (const char *c = strstr(path, "/."); c; c = strstr(c + 1, "/."))
		if (c[2] == '/' || !c[2] || (c[2] == '.' && (c[3] == '/' || !c[3])))
			return 1;
	return 0;
}

/* the container's root directory: config.json's root.path (spec.rootfs), joined to the
 * bundle; NULL where a `.` or `..` component would make that differ from normpath's */
static char *rootfs_of(const char *bundle)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof(path), "%s/config.json", bundle) >= (int)sizeof(path))
		return NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t size;
	char *text = read_all(fd, MAX_CONFIG, &size), *root = NULL, *joined = NULL;
	close(fd);
	json j;
	if (text == NULL || object(text, size, &j)) {
		free(text);
		return NULL;
	}
	int found = member(&j, "root"); /* null or missing: "rootfs"; what else Python would
					  * read as "rootfs" or str() is declined */
	if (found == 0 && *j.at == '{') {
		found = member(&j, "path");
		if (found == 0 && *j.at != 'n' && (*j.at != '"' || string(&j, &root)))
			found = -1;
	} else if (found == 0 && *j.at != 'n')
		found = -1;
	free(text);
	if (found < 0)
		return NULL;
	const char *relative = root && *root ? root : "rootfs";
	if (asprintf(&joined, "%s%s%s", *relative == '/' ? "" : bundle, *relative == '/' ? "" : "/",
		     relative) < 0)
		joined = NULL;
	free(root);
	if (joined && has_dots(joined)) {
		free(joined);
		return NULL;
	}
	return joined;
}

/* -- the cache: gpuwire.ldsocache, the same bytes ------------------------------------- */

#define OLD_MAGIC "ld.so-1.7.0"
#define MAGIC "glibc-ld.so.cache1.1"
#define HEADER 48
#define ENTRY 24
#define EXTENSION_MAGIC 0xeaa42174u
#define HWCAP_EXTENSION (1ull << 62)
#define ISA_LEVEL_MASK (0x3ffull << 32)

typedef struct {
	bytes name, path, key, hwcaps; /* hwcaps.p NULL: a legacy entry */
	int32_t flags;
	uint32_t osversion;
	uint64_t hwcap;
	int added, scanned;
	size_t order;
} entry;

static uint32_t word(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t word64(const unsigned char *p)
{
	return word(p) | (uint64_t)word(p + 4) << 32;
}

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* ldsocache._string: at most `limit` bytes and a NUL */
static int cstring(bytes data, uint64_t at, size_t limit, bytes *out)
{
	size_t room = at < data.n ? data.n - at : 0;
	const unsigned char *end = room ? memchr(data.p + at, 0, room < limit + 1 ? room : limit + 1) : NULL;
	if (end == NULL)
		return -1;
	*out = (bytes){data.p + at, (size_t)(end - data.p - at)};
	return 0;
}

/* ldsocache._hwcaps_names */
static int hwcaps_names(bytes data, size_t base, uint64_t at, bytes **names, size_t *count)
{
	if (at % 4 || at + 8 > data.n)
		return -1;
	uint64_t sections = word(data.p + at + 4), first = at + 8;
	if (word(data.p + at) != EXTENSION_MAGIC || first + sections * 16 > data.n)
		return -1;
	for (uint64_t s = 0; s < sections; s++) {
		const unsigned char *section = data.p + first + 16 * s;
		uint64_t start = word(section + 8), size = word(section + 12);
		if (start + size > data.n)
			return -1;
		if (word(section) == 1 && size && !(start % 4) && !(size % 4)) {
			free(*names);
			*count = size / 4;
			*names = calloc(*count, sizeof(bytes));
			if (*names == NULL)
				return -1;
			for (size_t i = 0; i < *count; i++)
				if (cstring(data, base + word(data.p + start + 4 * i), NAME_MAX, &(*names)[i]))
					return -1;
		}
	}
	return 0;
}

/* ldsocache.parse: the entries, into `out` (room for them and `extra` more) */
static int parse(bytes data, entry **out, size_t *count, size_t extra)
{
	size_t base = 0;
	int compat = data.n >= strlen(OLD_MAGIC) && !memcmp(data.p, OLD_MAGIC, strlen(OLD_MAGIC));
	if (compat) {
		if (data.n < 16)
			return -1;
		base = (size_t)((16 + (uint64_t)word(data.p + 12) * 12 + 7) & ~7ull);
	}
	if (base > data.n || data.n - base < HEADER || memcmp(data.p + base, MAGIC, strlen(MAGIC)))
		return -1;
	const unsigned char *header = data.p + base;
	uint64_t n = word(header + 20), extension = word(header + 32);
	if ((header[28] & 3) != 0 && (header[28] & 3) != 2)
		return -1;
	size_t start = base + HEADER;
	if (start + n * ENTRY > data.n || n > HOOK_MAX_ENTRIES)
		return -1;
	bytes *subdirs = NULL;
	size_t nsubdirs = 0;
	if (extension && hwcaps_names(data, base, extension, &subdirs, &nsubdirs))
		return -1;
	if (nsubdirs && compat)
		return -1;
	entry *entries = calloc(n + extra + 1, sizeof(entry));
	if (entries == NULL)
		return -1;
	for (size_t i = 0; i < n; i++) {
		const unsigned char *row = data.p + start + i * ENTRY;
		entry *e = &entries[i];
		e->flags = (int32_t)word(row);
		e->osversion = word(row + 12);
		e->hwcap = word64(row + 16);
		if (cstring(data, base + word(row + 4), NAME_MAX, &e->name) ||
		    cstring(data, base + word(row + 8), PATH_MAX, &e->path))
			return -1;
		if (((e->hwcap >> 32) & ~0x3ffull) == HWCAP_EXTENSION >> 32) {
			uint64_t index = e->hwcap & 0xffffffffu;
			if (index >= nsubdirs)
				return -1;
			e->hwcaps = subdirs[index];
			e->hwcap &= ISA_LEVEL_MASK;
		}
	}
	*out = entries;
	*count = n;
	return 0;
}

/* ldsocache.libcmp_key: each run of digits as 0x80 and its value in four bytes */
static int libcmp_key(entry *e)
{
	unsigned char *key = malloc(e->name.n * 5 + 1), *w = key;
	if (key == NULL)
		return -1;
	for (size_t i = 0; i < e->name.n;) {
		unsigned char c = e->name.p[i];
		if (c >= 0x80)
			return -1;
		if (c < '0' || c > '9') {
			*w++ = c;
			i++;
			continue;
		}
		uint64_t v = 0;
		for (; i < e->name.n && e->name.p[i] >= '0' && e->name.p[i] <= '9'; i++)
			if ((v = v * 10 + (e->name.p[i] - '0')) > INT_MAX)
				return -1;
		*w++ = 0x80;
		for (int s = 24; s >= 0; s -= 8)
			*w++ = (unsigned char)(v >> s);
	}
	e->key = (bytes){key, (size_t)(w - key)};
	return 0;
}

static int bytes_cmp(bytes a, bytes b)
{
	int c = memcmp(a.p, b.p, a.n < b.n ? a.n : b.n);
	return c ? c : (a.n > b.n) - (a.n < b.n);
}

static int by_key_descending(const void *x, const void *y)
{
	const entry *a = x, *b = y;
	int c = bytes_cmp(b->key, a->key);
	return c ? c : (a->order > b->order) - (a->order < b->order);
}

static uint64_t legacy_hwcap(const entry *e)
{
	return e->hwcaps.p ? 0 : e->hwcap;
}

#define CMP(a, b) (((a) > (b)) - ((a) < (b)))

/* ldsocache._tie_break, without the original order */
static int tie_break(const entry *a, const entry *b)
{
	uint64_t ha = legacy_hwcap(a), hb = legacy_hwcap(b);
	int c;
	if ((c = CMP(b->flags, a->flags)) || (c = CMP(!a->hwcaps.p, !b->hwcaps.p)))
		return c;
	bytes none = {(const unsigned char *)"", 0};
	if ((c = bytes_cmp(a->hwcaps.p ? a->hwcaps : none, b->hwcaps.p ? b->hwcaps : none)))
		return c;
	if ((c = CMP(__builtin_popcountll(hb), __builtin_popcountll(ha))) || (c = CMP(hb, ha)) ||
	    (c = CMP(b->osversion, a->osversion)))
		return c;
	return CMP(a->scanned, b->scanned);
}

static int by_tie_break(const void *x, const void *y)
{
	const entry *a = x, *b = y;
	int c = tie_break(a, b);
	return c ? c : CMP(a->order, b->order);
}

/* ldsocache._scanned_under: the position of the folder `e` was found in */
static int scanned_under(const entry *e, char **folders, int nfolders)
{
	int depth = e->hwcaps.p ? 3 : 1 + __builtin_popcountll(legacy_hwcap(e));
	size_t cut = e->path.n;
	const unsigned char *slash = NULL;
	for (size_t i = e->path.n; i-- > 0 && depth > 0;)
		if (e->path.p[i] == '/') {
			slash = e->path.p + i;
			depth--;
		}
	if (slash != NULL)
		cut = (size_t)(slash - e->path.p);
	for (int f = 0; f < nfolders; f++) {
		size_t n = strlen(folders[f]);
		while (n && folders[f][n - 1] == '/')
			n--;
		if (cut == n && !memcmp(e->path.p, folders[f], n))
			return f;
	}
	return nfolders;
}

static int reversed_descending(const void *x, const void *y)
{
	const bytes *a = x, *b = y;
	for (size_t i = 1; i <= a->n && i <= b->n; i++)
		if (a->p[a->n - i] != b->p[b->n - i])
			return CMP(b->p[b->n - i], a->p[a->n - i]);
	return CMP(b->n, a->n);
}

static int ascending(const void *x, const void *y)
{
	return bytes_cmp(*(const bytes *)x, *(const bytes *)y);
}

typedef struct {
	bytes *strings; /* reversed_descending, distinct */
	uint32_t *offsets;
	size_t count, size;
} table;

static uint32_t offset_of(const table *t, bytes s)
{
	const bytes *found = bsearch(&s, t->strings, t->count, sizeof(bytes), reversed_descending);
	return t->offsets[found - t->strings];
}

/* ldsocache._string_table */
static int string_table(table *t, bytes *all, size_t n)
{
	qsort(all, n, sizeof(bytes), reversed_descending);
	t->strings = all;
	t->offsets = calloc(n + 1, sizeof(uint32_t));
	if (t->offsets == NULL)
		return -1;
	size_t count = 0, size = 0;
	bytes previous = {(const unsigned char *)"", 0};
	uint32_t previous_at = 0;
	for (size_t i = 0; i < n; i++) {
		if (count && !reversed_descending(&all[i], &all[count - 1]))
			continue;
		bytes s = all[count] = all[i];
		if (previous.n >= s.n && !memcmp(previous.p + previous.n - s.n, s.p, s.n))
			t->offsets[count] = previous_at + (uint32_t)(previous.n - s.n);
		else {
			t->offsets[count] = (uint32_t)size;
			size += s.n + 1;
		}
		previous = s;
		previous_at = t->offsets[count++];
	}
	t->count = count;
	t->size = size;
	return 0;
}

/* ldsocache.render */
static unsigned char *render(entry *entries, size_t n, size_t *size)
{
	bytes *subdirs = calloc(n + 1, sizeof(bytes)), *all = calloc(3 * n + 1, sizeof(bytes));
	if (subdirs == NULL || all == NULL)
		return NULL;
	size_t nsub = 0, nall = 0;
	for (size_t i = 0; i < n; i++) {
		all[nall++] = entries[i].name;
		all[nall++] = entries[i].path;
		if (entries[i].hwcaps.p)
			subdirs[nsub++] = entries[i].hwcaps;
	}
	qsort(subdirs, nsub, sizeof(bytes), ascending);
	size_t distinct = 0;
	for (size_t i = 0; i < nsub; i++)
		if (!distinct || ascending(&subdirs[i], &subdirs[distinct - 1]))
			all[nall++] = subdirs[distinct++] = subdirs[i];
	nsub = distinct;
	table t;
	if (string_table(&t, all, nall))
		return NULL;
	size_t strings_at = HEADER + n * ENTRY, extension = (strings_at + t.size + 3) & ~(size_t)3;
	size_t gen = strlen(HOOK_GENERATOR), data_at = extension + 8 + 32;
	*size = data_at + 4 * nsub + gen - (nsub ? 0 : 16);
	unsigned char *out = calloc(*size, 1);
	if (out == NULL)
		return NULL;
	memcpy(out, MAGIC, strlen(MAGIC));
	put32(out + 20, (uint32_t)n);
	put32(out + 24, (uint32_t)t.size);
	out[28] = 2;
	put32(out + 32, (uint32_t)extension);
	for (size_t i = 0; i < n; i++) {
		entry *e = &entries[i];
		unsigned char *row = out + HEADER + i * ENTRY;
		uint64_t hwcap = e->hwcap;
		if (e->hwcaps.p) {
			bytes *at = bsearch(&e->hwcaps, subdirs, nsub, sizeof(bytes), ascending);
			hwcap |= HWCAP_EXTENSION | (uint64_t)(at - subdirs);
		}
		put32(row, (uint32_t)e->flags);
		put32(row + 4, (uint32_t)strings_at + offset_of(&t, e->name));
		put32(row + 8, (uint32_t)strings_at + offset_of(&t, e->path));
		put32(row + 12, e->osversion);
		put32(row + 16, (uint32_t)hwcap);
		put32(row + 20, (uint32_t)(hwcap >> 32));
	}
	for (size_t i = 0, at = strings_at; i < t.count; i++)
		if (at == strings_at + t.offsets[i]) {
			memcpy(out + at, t.strings[i].p, t.strings[i].n);
			at += t.strings[i].n + 1;
		}
	unsigned char *x = out + extension;
	put32(x, EXTENSION_MAGIC);
	put32(x + 4, nsub ? 2 : 1);
	size_t hwcaps_size = 4 * nsub;
	put32(x + 8 + 8, (uint32_t)(nsub ? data_at + hwcaps_size : data_at - 16));
	put32(x + 8 + 12, (uint32_t)gen);
	if (nsub) {
		put32(x + 24, 1);
		put32(x + 24 + 8, (uint32_t)data_at);
		put32(x + 24 + 12, (uint32_t)hwcaps_size);
		for (size_t i = 0; i < nsub; i++)
			put32(out + data_at + 4 * i, (uint32_t)strings_at + offset_of(&t, subdirs[i]));
	}
	memcpy(out + *size - gen, HOOK_GENERATOR, gen);
	return out;
}

/* ldsocache.update: the image's cache (`old`, NULL: none) with the added entries in */
static unsigned char *updated(bytes old, char **paths, int32_t *flags, int nadded, char **folders,
			      int nfolders, size_t *size)
{
	entry *entries = NULL;
	size_t n = 0;
	if (old.p && old.n) {
		if (parse(old, &entries, &n, (size_t)nadded))
			return NULL;
	} else if ((entries = calloc((size_t)nadded + 1, sizeof(entry))) == NULL)
		return NULL;
	size_t kept = 0;
	for (size_t i = 0; i < n; i++) {
		int replaced = 0;
		for (int a = 0; a < nadded && !replaced; a++)
			replaced = entries[i].path.n == strlen(paths[a]) &&
				   !memcmp(entries[i].path.p, paths[a], entries[i].path.n);
		if (!replaced)
			entries[kept++] = entries[i];
	}
	for (int a = 0; a < nadded; a++) {
		const char *base = strrchr(paths[a], '/');
		entries[kept++] = (entry){
			.name = {(const unsigned char *)base + 1, strlen(base + 1)},
			.path = {(const unsigned char *)paths[a], strlen(paths[a])},
			.flags = flags[a],
			.added = 1,
		};
	}
	for (size_t i = 0; i < kept; i++) {
		entries[i].order = i;
		entries[i].scanned = scanned_under(&entries[i], folders, nfolders);
		if (libcmp_key(&entries[i]))
			return NULL;
	}
	qsort(entries, kept, sizeof(entry), by_key_descending);
	for (size_t start = 0, end; start < kept; start = end) {
		for (end = start + 1; end < kept && !bytes_cmp(entries[end].key, entries[start].key); end++)
			;
		if (end - start < 2)
			continue;
		qsort(entries + start, end - start, sizeof(entry), by_tie_break);
		for (size_t i = start; i + 1 < end; i++)
			if ((entries[i].added || entries[i + 1].added) && !tie_break(&entries[i], &entries[i + 1]))
				return NULL; /* only ldconfig's directory scan orders them */
	}
	return render(entries, kept, size);
}

/* -- the root: links and the cache file ----------------------------------------------- */

typedef struct {
	int dir;
	const char *name;
	char *old; /* the image's link target it replaced (and its owner); NULL: made here */
	uid_t uid;
	gid_t gid;
} made;

static void undo(made *links, int n)
{
	while (n-- > 0) {
		if (links[n].dir < 0)
			continue;
		unlinkat(links[n].dir, links[n].name, 0);
		if (links[n].old && symlinkat(links[n].old, links[n].dir, links[n].name) == 0)
			fchownat(links[n].dir, links[n].name, links[n].uid, links[n].gid,
				 AT_SYMLINK_NOFOLLOW);
	}
}

/* inroot.make_symlink: 1 made or in place, 0 the image's own file there, -1 failed; what
 * it changed goes into `record` (dir -1: nothing) */
static int make_symlink(int dir, const char *name, const char *target, made *record)
{
	*record = (made){.dir = dir, .name = name};
	if (symlinkat(target, dir, name) == 0)
		return 1;
	record->dir = -1;
	struct stat st;
	char old[PATH_MAX];
	ssize_t n;
	if (errno != EEXIST)
		return -1;
	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISLNK(st.st_mode))
		return 0;
	if ((n = readlinkat(dir, name, old, sizeof(old) - 1)) < 0)
		return -1;
	old[n] = '\0';
	if (strcmp(old, target) == 0)
		return 1;
	record->uid = st.st_uid;
	record->gid = st.st_gid;
	if ((record->old = strdup(old)) == NULL || unlinkat(dir, name, 0))
		return -1;
	record->dir = dir;
	return symlinkat(target, dir, name) == 0 ? 1 : -1;
}

int write_all(int fd, const void *data, size_t size)
{
	for (size_t done = 0; done < size;) {
		ssize_t n = write(fd, (const char *)data + done, size - done);
		if (n <= 0 && !(n < 0 && errno == EINTR))
			return -1;
		done += n > 0 ? (size_t)n : 0;
	}
	return 0;
}

/* ldcache.replace */
static int replace_cache(int etc, const unsigned char *data, size_t size)
{
	char temp[64];
	snprintf(temp, sizeof(temp), ".ld.so.cache.gpuwire-%d", (int)getpid());
	int fd = openat2_(etc, temp, O_WRONLY | O_CREAT | O_EXCL, 0644, EXACT);
	if (fd < 0)
		return -1;
	int ok = fchmod(fd, 0644) == 0 && write_all(fd, data, size) == 0;
	ok &= close(fd) == 0;
	if (ok && renameat(etc, temp, etc, "ld.so.cache") == 0)
		return 0;
	unlinkat(etc, temp, 0);
	return -1;
}

typedef struct {
	char **folders, **paths, **targets, **links;
	int32_t *flags;
	int nfolders, nentries, nlinks;
} request;

/* resolve.open_file: `path` in the root open read-only where it is a regular file, -1
 * otherwise (errno ENOENT where nothing is there). Looked up O_PATH, which opens nothing of
 * the file's own (no device's open, no wait for a FIFO's writer), its type read from that
 * descriptor, and only a regular file opened, through it: the same inode */
static int open_file(int root, const char *path, struct stat *st)
{
	int at = lookup(root, path, O_PATH), fd = -1, regular = 0;
	char proc[32];
	if (at < 0)
		return -1;
	if (fstat(at, st) == 0 && (regular = S_ISREG(st->st_mode))) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", at);
		fd = open(proc, O_RDONLY | O_CLOEXEC);
	}
	close(at);
	if (fd < 0)
		errno = regular ? EIO : EINVAL; /* not "no cache": declined */
	return fd;
}

/* the image's cache as the container sees it: old.p NULL where there is none */
static int read_cache(int root, bytes *old)
{
	*old = (bytes){NULL, 0};
	struct stat st;
	int fd = open_file(root, "/etc/ld.so.cache", &st);
	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	size_t size = 0;
	if (st.st_size <= HOOK_MAX_CACHE)
		old->p = (unsigned char *)read_all(fd, (size_t)st.st_size + 1, &size);
	old->n = size;
	close(fd);
	return old->p ? 0 : -1;
}

/* the work of one call, in the container's mount namespace: DONE or DECLINED. The links
 * first, then the cache, as ldcache.make does (a link may be what the cache's path leads to) */
static int apply(const char *rootfs, const request *r)
{
	int root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC), etc = -1, n = 0;
	made *links = calloc((size_t)r->nlinks + 1, sizeof(made));
	if (root < 0 || links == NULL)
		return DECLINED;
	for (; n < r->nlinks; n++) {
		const char *slash = strrchr(r->links[n], '/');
		char *parent = strndup(r->links[n], (size_t)(slash - r->links[n]));
		int dir = parent ? lookup(root, parent, O_PATH | O_DIRECTORY) : -1;
		links[n].dir = -1;
		if (dir < 0 || make_symlink(dir, slash + 1, r->targets[n], &links[n]) != 1) {
			undo(links, n + 1);
			return DECLINED;
		}
	}
	if (r->nfolders == 0)
		return DONE;
	unsigned char *cache = NULL;
	size_t size = 0;
	bytes old = {NULL, 0};
	if (r->nentries == 0 || (etc = lookup(root, "/etc", O_PATH | O_DIRECTORY)) < 0 ||
	    read_cache(root, &old) ||
	    !(cache = updated(old, r->paths, r->flags, r->nentries, r->folders, r->nfolders, &size)) ||
	    ((old.n != size || memcmp(old.p, cache, size)) && replace_cache(etc, cache, size))) {
		undo(links, n);
		return DECLINED;
	}
	return DONE;
}

/* ldcache.open_ldconfig's check, that the host's ldconfig has no interpreter: a 64-bit
 * little-endian ELF file without PT_INTERP (anything else declined) */
static int is_static(const char *path)
{
	unsigned char header[64], entry[56];
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ok = 0;
	if (fd >= 0 && fstat(fd, &st) == 0 && pread(fd, header, sizeof(header), 0) == sizeof(header) &&
	    !memcmp(header, "\177ELF\2\1", 6) && (header[54] | header[55] << 8) == sizeof(entry)) {
		uint64_t at = word64(header + 32);
		unsigned count = header[56] | header[57] << 8;
		ok = 1;
		for (unsigned i = 0; ok && i < count; i++) {
			ok = pread(fd, entry, sizeof(entry), (off_t)(at + i * sizeof(entry))) ==
				     sizeof(entry) &&
			     word(entry) != 3; /* PT_INTERP */
			uint64_t offset = word64(entry + 8), size = word64(entry + 32);
			if (word(entry) == 2) /* PT_DYNAMIC, which elf.read reads */
				ok &= offset <= (uint64_t)st.st_size && size <= (uint64_t)st.st_size - offset;
		}
	}
	if (fd >= 0)
		close(fd);
	return ok;
}

/* what Python's str.encode() takes as it is: the cache's folders and paths (ldsocache) */
static int ascii(const char *s)
{
	while (*s && (unsigned char)*s < 0x80)
		s++;
	return *s == '\0';
}

/* whether a link goes into a directory another link replaces: the Python hook keeps each
 * directory it opened, so it would land elsewhere than a fresh lookup finds */
static int nested_links(const request *r)
{
	for (int a = 0; a < r->nlinks; a++) {
		size_t len = strlen(r->links[a]);
		for (int b = 0; b < r->nlinks; b++)
			if (!strncmp(r->links[b], r->links[a], len) && r->links[b][len] == '/')
				return 1;
	}
	return 0;
}

/* gpuwire.edits.parse_ldcache_args; -1 where it would raise, or declined (anything but
 * ASCII in a path the cache holds, nested links, an ldconfig that is not a static ELF file) */
static int parse_args(int argc, char **argv, request *r)
{
	const char *ldconfig = "";
	size_t room = (size_t)argc + 1;
	r->folders = calloc(room, sizeof(char *));
	r->paths = calloc(room, sizeof(char *));
	r->targets = calloc(room, sizeof(char *));
	r->links = calloc(room, sizeof(char *));
	r->flags = calloc(room, sizeof(int32_t));
	if (!r->folders || !r->paths || !r->targets || !r->links || !r->flags || argc > MAX_ITEMS)
		return -1;
	for (int i = 0; i < argc; i += 2) {
		if (i + 1 >= argc)
			return -1;
		const char *flag = argv[i];
		char *v = argv[i + 1], *sep = strstr(v, "::");
		if (!strcmp(flag, "--ldconfig"))
			ldconfig = v;
		else if (!strcmp(flag, "--folder") && *v == '/' && ascii(v))
			r->folders[r->nfolders++] = v;
		else if (!strcmp(flag, "--link") && sep && sep[2] == '/') {
			if ((r->targets[r->nlinks] = strndup(v, (size_t)(sep - v))) == NULL)
				return -1;
			r->links[r->nlinks++] = sep + 2;
		} else if (!strcmp(flag, "--entry") && sep && sep[2] == '/' && ascii(sep) && v[0] == '0' &&
			   v[1] == 'x' && sep > v + 2 && strspn(v + 2, "0123456789abcdef") == (size_t)(sep - v - 2)) {
			errno = 0;
			unsigned long value = strtoul(v + 2, NULL, 16);
			if (errno || value > INT32_MAX)
				return -1;
			r->flags[r->nentries] = (int32_t)value;
			r->paths[r->nentries++] = sep + 2;
		} else
			return -1;
	}
	return *ldconfig == '/' && !nested_links(r) && is_static(ldconfig) ? 0 : -1;
}

/* the OCI state's bundle and pid (0: none given) */
static int parse_state(const char *state, size_t size, char **bundle, long *pid)
{
	json j;
	*pid = 0;
	if (object(state, size, &j))
		return -1;
	json at = j;
	if (member(&at, "bundle") || string(&at, bundle))
		return -1;
	at = j;
	int found = member(&at, "pid");
	if (found < 0)
		return -1;
	if (found == 0) {
		char *end;
		errno = 0;
		*pid = strtol(at.at, &end, 10);
		if (errno || *pid <= 0 || end == at.at || strchr(".eE", *end))
			return -1;
	}
	return 0;
}

/* hook.py's _enter_mount_namespace_of */
static int enter_mount_namespace_of(long pid)
{
	char path[64];
	struct stat here, there;
	snprintf(path, sizeof(path), "/proc/%ld/ns/mnt", pid);
	if (stat("/proc/self/ns/mnt", &here) || stat(path, &there))
		return -1;
	if (here.st_dev == there.st_dev && here.st_ino == there.st_ino)
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int joined = setns(fd, CLONE_NEWNS);
	close(fd);
	return joined;
}

int ldcache_hook(int argc, char **argv, const char *state, size_t size)
{
	request r = {0};
	char *bundle = NULL, *rootfs;
	long pid;
	if (parse_args(argc, argv, &r) || parse_state(state, size, &bundle, &pid) || !*bundle ||
	    (rootfs = rootfs_of(bundle)) == NULL)
		return LDCACHE_DECLINED;
	/* an ignored SIGCHLD (inherited) would reap the child unseen; put back for a decline */
	struct sigaction plain = {.sa_handler = SIG_DFL}, inherited;
	sigaction(SIGCHLD, &plain, &inherited);
	pid_t child = fork(), waited;
	if (child == 0)
		_exit(pid && enter_mount_namespace_of(pid) ? DECLINED : apply(rootfs, &r));
	int status = 0;
	while (child > 0 && (waited = waitpid(child, &status, 0)) < 0 && errno == EINTR)
		;
	sigaction(SIGCHLD, &inherited, NULL);
	return child > 0 && waited == child && WIFEXITED(status) && WEXITSTATUS(status) == DONE
		       ? 0
		       : LDCACHE_DECLINED;
}
#endif
