/* Owns parsing and storage of environment parameters; consumers call the getters. */
#include "params.h"
#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum param_type { PT_INT, PT_STR };

struct param_spec {
    const char *name;
    enum param_type type;
    long def, lo, hi;
    const char *def_str;
    const char *doc;
};

static const struct param_spec specs[PARAM_COUNT] = {
#define PARAM_INT(id, nm, d, l, h, dc) [id] = {nm, PT_INT, d, l, h, NULL, dc},
#define PARAM_STR(id, nm, d, dc)       [id] = {nm, PT_STR, 0, 0, 0, d, dc},
#include "params.def"
#undef PARAM_INT
#undef PARAM_STR
};

struct param_value {
    long i;
    const char *s; /* points into environ or at the default */
    bool set;
};

static struct param_value values[PARAM_COUNT];
static bool loaded;

/* Strict integer parse: the whole string, base 10 (or 0x...), no overflow. */
static int parse_long(const char *text, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 0);
    if (errno || end == text) return -EINVAL;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end) return -EINVAL;
    *out = v;
    return 0;
}

int params_load(void) {
    int bad = 0;
    for (int id = 0; id < PARAM_COUNT; id++) {
        const struct param_spec *sp = &specs[id];
        const char *env = getenv(sp->name);
        struct param_value *v = &values[id];

        v->set = env && *env;
        v->i = sp->def;
        v->s = sp->def_str;
        if (!v->set) continue;
        if (sp->type == PT_STR) {
            v->s = env;
            continue;
        }
        long parsed;
        if (parse_long(env, &parsed) || parsed < sp->lo || parsed > sp->hi) {
            WARN(
                "%s=\"%s\" is not valid (expected an integer in [%ld, %ld]); using the default %ld",
                sp->name, env, sp->lo, sp->hi, sp->def);
            v->set = false;
            bad++;
            continue;
        }
        v->i = parsed;
    }
    loaded = true;
    return bad;
}

static void ensure_loaded(void) {
    if (!loaded) params_load();
}

long param_int(enum param_id id) {
    ensure_loaded();
    return values[id].i;
}

const char *param_str(enum param_id id) {
    ensure_loaded();
    return values[id].s;
}

const char *param_name(enum param_id id) {
    return specs[id].name;
}

bool param_is_set(enum param_id id) {
    ensure_loaded();
    return values[id].set;
}

int param_choice(enum param_id id, const char *const *choices) {
    const char *v = param_str(id);
    for (int i = 0; choices[i]; i++)
        if (!strcasecmp(v, choices[i])) return i;
    char list[256] = "";
    for (int i = 0; choices[i]; i++) {
        strncat(list, choices[i], sizeof(list) - strlen(list) - 1);
        if (choices[i + 1]) strncat(list, ", ", sizeof(list) - strlen(list) - 1);
    }
    WARN("%s=\"%s\" is not one of {%s}; using \"%s\"", specs[id].name, v, list, choices[0]);
    return 0;
}

void params_dump(void) {
    ensure_loaded();
    for (int id = 0; id < PARAM_COUNT; id++) {
        if (!values[id].set) continue;
        if (specs[id].type == PT_INT)
            INFO(NCCL_INIT | NCCL_ENV, "%s set by environment to %ld", specs[id].name,
                 values[id].i);
        else
            INFO(NCCL_INIT | NCCL_ENV, "%s set by environment to \"%s\"", specs[id].name,
                 values[id].s);
    }
}

/* A table cell's text: a bare | would end the cell (the rest of it is lost when rendered),
 * and <dev> would read as an HTML tag outside code; both are escaped. */
static void markdown_cell(FILE *out, const char *text) {
    bool code = false;
    for (const char *p = text; *p; p++) {
        if (*p == '`') code = !code;
        if (*p == '|')
            fputs("\\|", out);
        else if ((*p == '<' || *p == '>') && !code)
            fputs(*p == '<' ? "&lt;" : "&gt;", out);
        else
            fputc(*p, out);
    }
}

void params_write_markdown(FILE *out) {
    fprintf(out, "| variable | default | meaning |\n| --- | --- | --- |\n");
    for (int id = 0; id < PARAM_COUNT; id++) {
        const struct param_spec *sp = &specs[id];
        if (sp->type == PT_INT)
            fprintf(out, "| `%s` | `%ld` | ", sp->name, sp->def);
        else
            fprintf(out, "| `%s` | `%s` | ", sp->name, *sp->def_str ? sp->def_str : "(unset)");
        markdown_cell(out, sp->doc);
        fputs(" |\n", out);
    }
}
