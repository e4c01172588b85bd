// Link-time stubs for the symbols NCCL's xml.cc / topo.cc / utils.cc / param.cc / os/linux.cc
// reference but which live in parts of NCCL not needed to parse a topology XML and build an
// ncclTopoSystem from it (debug logging, NVML, net/gin/rma plugins, bootstrap, sockets, paths).
// Headers are NCCL's real headers + the real CUDA 13 headers; only these definitions are stand-ins.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "nvmlwrap.h"
#include "net.h"
#include "gin.h"
#include "rma.h"
#include "bootstrap.h"
#include "socket.h"
#include "env.h"
#include "graph.h"
#include "param/utils.h"

extern "C" { int harnessWarnCount = 0; }

// ---- debug.cc replacements ----
int ncclDebugLevel = NCCL_LOG_INFO;           // show INFO ...
uint64_t ncclDebugMask = NCCL_GRAPH | NCCL_ENV; // ... only for the GRAPH/ENV subsystems
FILE* ncclDebugFile = stderr;
thread_local int ncclDebugNoWarn = 0;
char ncclLastError[1024] = "";

void ncclDebugLogInternal(ncclDebugLogLevel level, unsigned long flags, const char* file, const char* func, int line,
                          const char* fmt, ...) {
  if (level == NCCL_LOG_WARN && ncclDebugNoWarn) level = NCCL_LOG_INFO;
  if (level == NCCL_LOG_INFO && !(flags & ncclDebugMask)) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (level == NCCL_LOG_WARN) {
    harnessWarnCount++;
    strncpy(ncclLastError, buf, sizeof(ncclLastError) - 1);
    fprintf(stderr, "NCCL WARN %s  [%s:%d %s]\n", buf, file ? file : "?", line, func ? func : "?");
  } else if (level == NCCL_LOG_INFO) {
    fprintf(stderr, "NCCL INFO %s\n", buf);
  } else {
    fprintf(stderr, "NCCL TRACE %s\n", buf);
  }
}
void ncclDebugLog(ncclDebugLogLevel level, unsigned long flags, const char* filefunc, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  ncclDebugLogInternal(level, flags, filefunc, NULL, line, "%s", buf);
}

// ---- init.cc / env plugin / param plugin replacements ----
extern "C" const char* ncclGetErrorString(ncclResult_t r) {
  static char text[32];
  snprintf(text, sizeof(text), "ncclResult_t %d", (int)r);  // the harness prints NCCL's WARN lines instead
  return text;
}
ncclResult_t ncclInitEnv(void) { return ncclSuccess; }
const char* ncclEnvPluginGetEnv(const char* name) { return getenv(name); }
extern "C" bool ncclParamIsCacheDisabled(const char* key) { return false; }

#define NVMLNA do { INFO(NCCL_GRAPH, "harness stub: NVML not available"); return ncclSystemError; } while (0)
#define NOTAVAIL(what) do { WARN("harness stub: %s not available (no GPU/NVML/plugin)", what); return ncclSystemError; } while (0)

// ---- nvmlwrap.cc ----
ncclResult_t ncclNvmlDeviceGetHandleByPciBusId(const char*, nvmlDevice_t*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetIndex(nvmlDevice_t, unsigned*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned int, nvmlEnableState_t*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t, unsigned int, nvmlPciInfo_t*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetNvLinkCapability(nvmlDevice_t, unsigned int, nvmlNvLinkCapability_t, unsigned int*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int*, int*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetFieldValues(nvmlDevice_t, int, nvmlFieldValue_t*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetPciInfo(nvmlDevice_t, nvmlPciInfo_t*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t, unsigned int*) { NVMLNA; }
ncclResult_t ncclNvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t, unsigned int*) { NVMLNA; }

// ---- net / gin / rma plugins, bootstrap ----
ncclResult_t ncclNetGetDevCount(int, int*, int*) { NOTAVAIL("net plugin"); }
ncclResult_t ncclNetSetVirtDevCount(int, int) { NOTAVAIL("net plugin"); }
ncclResult_t ncclCollNetGetDevCount(int, int*, int*) { NOTAVAIL("collnet plugin"); }
ncclResult_t ncclCollNetSetVirtDevCount(int, int) { NOTAVAIL("collnet plugin"); }
ncclResult_t ncclGinGetDevCount(int, int*, int*) { NOTAVAIL("gin plugin"); }
ncclResult_t ncclRmaGetDevCount(int, int*, int*) { NOTAVAIL("rma plugin"); }
ncclResult_t bootstrapIntraNodeAllGather(void*, int*, int, int, void*, int) { NOTAVAIL("bootstrap"); }

// ---- socket.cc (only referenced by os/linux.cc socket helpers) ----
const char* ncclSocketToString(const union ncclSocketAddress*, char* buf, const int) { buf[0] = 0; return buf; }
ncclResult_t ncclSocketProgress(int, struct ncclSocket*, void*, int, int*, int*) { NOTAVAIL("sockets"); }
int64_t ncclParamPollTimeOut() { return 0; }
int64_t ncclParamRetryCnt() { return 0; }
int64_t ncclParamRetryTimeOut() { return 0; }
int64_t ncclParamSetCpuStackSize() { return 0; }
int64_t ncclParamSocketMaxRecvBuff() { return -1; }
int64_t ncclParamSocketMaxSendBuff() { return -1; }

// ---- paths.cc (paths are not computed by this harness) ----
ncclResult_t ncclGetLocalCpu(struct ncclTopoSystem*, int, int*) { NOTAVAIL("paths (ncclTopoComputePaths)"); }
ncclResult_t ncclTopoPrintPaths(struct ncclTopoSystem*) { return ncclSuccess; }
