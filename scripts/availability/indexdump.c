// Prints every symbol occurrence an index store holds, one per line, tab-separated:
//   source-file  line  column  roles  usr  name
// using the toolchain's libIndexStore (the C API in indexstore/indexstore.h). Used by
// scripts/check-client-availability.sh to learn which APIs the client's code references.
#include <indexstore/indexstore.h>
#include <stdio.h>
#include <string.h>

static void put(indexstore_string_ref_t s) { fwrite(s.data, 1, s.length, stdout); }

struct record_context { indexstore_string_ref_t file; };

/// `ref` as a C string in `buffer`; false when it does not fit.
static bool c_string(indexstore_string_ref_t ref, char *buffer, size_t size) {
    if (ref.length >= size) return false;
    memcpy(buffer, ref.data, ref.length);
    buffer[ref.length] = 0;
    return true;
}

static bool on_occurrence(void *context, indexstore_occurrence_t occurrence) {
    struct record_context *r = context;
    indexstore_symbol_t symbol = indexstore_occurrence_get_symbol(occurrence);
    unsigned line = 0, column = 0;
    indexstore_occurrence_get_line_col(occurrence, &line, &column);
    put(r->file);
    printf("\t%u\t%u\t%llu\t", line, column, (unsigned long long)indexstore_occurrence_get_roles(occurrence));
    put(indexstore_symbol_get_usr(symbol));
    putchar('\t');
    put(indexstore_symbol_get_name(symbol));
    putchar('\n');
    return true;
}

struct unit_context { indexstore_t store; };

static bool on_dependency(void *context, indexstore_unit_dependency_t dependency) {
    struct unit_context *u = context;
    if (indexstore_unit_dependency_get_kind(dependency) != INDEXSTORE_UNIT_DEPENDENCY_RECORD) return true;
    if (indexstore_unit_dependency_is_system(dependency)) return true;
    char record[4096];
    if (!c_string(indexstore_unit_dependency_get_name(dependency), record, sizeof record)) return true;
    indexstore_error_t error = NULL;
    indexstore_record_reader_t reader = indexstore_record_reader_create(u->store, record, &error);
    if (!reader) {
        fprintf(stderr, "indexdump: cannot read record %s: %s\n", record, error ? indexstore_error_get_description(error) : "?");
        if (error) indexstore_error_dispose(error);
        return true;
    }
    struct record_context r = { indexstore_unit_dependency_get_filepath(dependency) };
    indexstore_record_reader_occurrences_apply_f(reader, &r, on_occurrence);
    indexstore_record_reader_dispose(reader);
    return true;
}

static bool on_unit(void *context, indexstore_string_ref_t unit_name) {
    struct unit_context *u = context;
    char name[4096];
    if (!c_string(unit_name, name, sizeof name)) return true;
    indexstore_error_t error = NULL;
    indexstore_unit_reader_t reader = indexstore_unit_reader_create(u->store, name, &error);
    if (!reader) {
        if (error) indexstore_error_dispose(error);
        return true;
    }
    if (!indexstore_unit_reader_is_system_unit(reader)) indexstore_unit_reader_dependencies_apply_f(reader, u, on_dependency);
    indexstore_unit_reader_dispose(reader);
    return true;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: indexdump <index-store-path>\n");
        return 2;
    }
    indexstore_error_t error = NULL;
    indexstore_t store = indexstore_store_create(argv[1], &error);
    if (!store) {
        fprintf(stderr, "indexdump: cannot open %s: %s\n", argv[1], error ? indexstore_error_get_description(error) : "?");
        return 1;
    }
    struct unit_context u = { store };
    indexstore_store_units_apply_f(store, 0, &u, on_unit);
    indexstore_store_dispose(store);
    return 0;
}
