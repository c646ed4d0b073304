/* A small, strict JSON reader (RFC 8259) for config.json, safetensors headers and tokenizer.json.
 *
 * The whole document is parsed into one arena: values, member arrays and decoded strings live there and
 * are freed together by json_free(). Strings are decoded (escapes, \u surrogate pairs -> UTF-8) and
 * NUL-terminated; `length` gives the byte count, so strings holding "\u0000" stay intact.
 * Limits that keep hostile input from exhausting the stack: nesting depth at most JSON_MAX_DEPTH.
 * A key repeated within one object fails the parse ("duplicate key \"K\"" at the repeat), since Python's json
 * (and so transformers and vLLM) keeps the last value where a first-match lookup would see the first: the
 * file would mean two things. A caller that must read such input as Python does asks for
 * JSON_DUPLICATE_KEYS_LAST_WINS instead. Either way every object's keys are distinct after parsing.
 */
#ifndef KITE_UTIL_JSON_H
#define KITE_UTIL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 256

typedef enum json_type {
    JSON_TYPE_NULL,
    JSON_TYPE_FALSE,
    JSON_TYPE_TRUE,
    JSON_TYPE_NUMBER,
    JSON_TYPE_STRING,
    JSON_TYPE_ARRAY,
    JSON_TYPE_OBJECT,
} json_type;

typedef struct json_value json_value;
typedef struct json_member json_member;

struct json_value {
    json_type type;
    /* NUMBER: true when the literal has no fraction or exponent and fits in int64 (then `integer` holds it). */
    bool is_integer;
    /* NUMBER: an integer literal beyond int64 (no fraction or exponent): `digits` holds it as written, since
     * Python reads it as an int and writes every digit back. `number` is its nearest double either way. */
    bool is_big_integer;
    /* STRING: bytes (without the terminating NUL); ARRAY: items; OBJECT: members. */
    size_t length;
    union {
        struct {
            double number;
            union {
                int64_t integer;    /* is_integer */
                const char *digits; /* is_big_integer: the literal, NUL-terminated ("-" then digits) */
            };
        } num;
        const char *string;        /* STRING */
        const json_value *items;   /* ARRAY, `length` of them */
        const json_member *members; /* OBJECT, `length` of them, in document order */
    } as;
};

struct json_member {
    const char *key; /* decoded, NUL-terminated */
    size_t key_length;
    json_value value;
};

typedef struct json_error {
    size_t offset; /* byte offset of the problem in the input */
    int line;      /* 1-based */
    int column;    /* 1-based, in bytes */
    char message[320]; /* room for a 64-byte key escaped in full */
} json_error;

typedef struct json_document json_document;

typedef enum json_duplicate_keys {
    JSON_DUPLICATE_KEYS_REFUSE,    /* a key twice in one object is an error (json_parse) */
    JSON_DUPLICATE_KEYS_LAST_WINS, /* as a Python dict: one member, at the key's first place, with its last value */
} json_duplicate_keys;

typedef struct json_parse_options {
    json_duplicate_keys duplicate_keys;
} json_parse_options;

/* Parses text[0..length). Returns NULL on failure and fills *error (error may be NULL).
 * Trailing non-whitespace after the root value is an error; so is a repeated key (JSON_DUPLICATE_KEYS_REFUSE). */
json_document *json_parse(const char *text, size_t length, json_error *error);
/* The same with options; NULL options means json_parse's. */
json_document *json_parse_with_options(const char *text, size_t length, const json_parse_options *options,
                                       json_error *error);
void json_free(json_document *document);
const json_value *json_root(const json_document *document);

/* Lookups; NULL when absent or when `object` is not an object. */
const json_value *json_object_member(const json_value *object, const char *key);

/* Typed accessors: return false (leaving *out untouched) when the value has another type or is out of range. */
bool json_get_int64(const json_value *value, int64_t *out);
bool json_get_double(const json_value *value, double *out);
bool json_get_bool(const json_value *value, bool *out);
static inline bool json_is_string(const json_value *value) { return value && value->type == JSON_TYPE_STRING; }
static inline bool json_is_array(const json_value *value) { return value && value->type == JSON_TYPE_ARRAY; }
static inline bool json_is_object(const json_value *value) { return value && value->type == JSON_TYPE_OBJECT; }
static inline bool json_is_null(const json_value *value) { return value && value->type == JSON_TYPE_NULL; }

/* The length of the UTF-8 sequence at s (at most `available` bytes) as json_parse accepts it inside a
 * string, 0 when it is invalid (overlong, a surrogate, past U+10FFFF, cut short). */
size_t json_utf8_sequence_length(const char *s, size_t available);

/* "object", "string", ... for messages. */
const char *json_type_name(json_type type);

#endif
