/* SPDX-License-Identifier: Apache-2.0 */
/*
 * marker.c -- a test aid, linked into a plug-in model library: when a
 * process loads the library, this constructor appends the process's id to
 * the file $FB_PLUGIN_MARKER names (nothing when it is unset). A test then
 * knows which processes dlopen()ed the library, and which did not
 * (tests/integration/plugin_path.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void
marker_loaded(void)
{
	const char *path = getenv("FB_PLUGIN_MARKER");
	FILE *f;

	if (path == NULL || path[0] == '\0' || (f = fopen(path, "a")) == NULL) {
		return;
	}
	fprintf(f, "%ld\n", (long)getpid());
	fclose(f);
}
