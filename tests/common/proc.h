/* Test helper: processes still running whose command line holds a marker
 * (to check that a command left nothing behind). */
#ifndef KVTIER_TESTS_PROC_H
#define KVTIER_TESTS_PROC_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>

static inline int processes_with(const char *marker) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (buf[i] == 0) buf[i] = ' ';
        buf[len] = 0;
        n += strstr(buf, marker) != NULL;
    }
    if (d) closedir(d);
    return n;
}

#endif
