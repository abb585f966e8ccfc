/*
 * Environment parameters: read and validated once per init from the table in
 * params.def. A malformed or out-of-range value is WARNed about (name, value,
 * accepted range) and replaced by its default, never misread silently.
 */
#ifndef ERDMA_PARAMS_H
#define ERDMA_PARAMS_H

#include <stdbool.h>
#include <stdio.h>

enum param_id {
#define PARAM_INT(id, name, def, lo, hi, doc) id,
#define PARAM_STR(id, name, def, doc)         id,
#include "params.def"
#undef PARAM_INT
#undef PARAM_STR
    PARAM_COUNT
};

/* Reads every variable; returns the number of invalid values (each WARNed). */
int params_load(void);
long param_int(enum param_id id);
const char *param_str(enum param_id id);
const char *param_name(enum param_id id);
bool param_is_set(enum param_id id);
/* One INFO line per value that differs from its default. */
void params_dump(void);
/* The README reference table. */
void params_write_markdown(FILE *out);
/* Picks the index of value in choices (NULL-terminated); WARNs and returns 0 (the default) when
 * absent. */
int param_choice(enum param_id id, const char *const *choices);

#endif
