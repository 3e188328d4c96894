// An input file read whole in one call, without Python between the system calls (open, fstat,
// read, the read that checks the end, close): a prep thread lets go of the GIL once per file.
// The checks are imgops.io.inputs.read_input_bytes's: a regular file, at most `limit` bytes,
// neither shrinking nor growing while it is read; the caller words the refusals.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace imgops {
namespace files {

enum class ReadOutcome { kRead, kFailed, kNotRegular, kTooLarge, kShrank, kGrew };

struct Opened {
  int fd = -1;
  int error = 0;  // errno of a failed open or fstat
  uint64_t size = 0;
  uint32_t mode = 0;
};

// Opens `path` without blocking (a FIFO never waits for a writer) and reads its stat.
inline Opened open_input(const char* path) {
  Opened opened;
  opened.fd = ::open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (opened.fd < 0) {
    opened.error = errno;
    return opened;
  }
  struct stat info;
  if (::fstat(opened.fd, &info) != 0) {
    opened.error = errno;
    ::close(opened.fd);
    opened.fd = -1;
    return opened;
  }
  opened.size = static_cast<uint64_t>(info.st_size);
  opened.mode = static_cast<uint32_t>(info.st_mode);
  return opened;
}

// Reads exactly `size` bytes of the opened file into out, then checks that nothing follows;
// closes it. `done` says how many bytes came before a shrink.
inline ReadOutcome read_opened(int fd, uint8_t* out, uint64_t size, uint64_t* done,
                               int* error) {
  uint64_t got = 0;
  ReadOutcome outcome = ReadOutcome::kRead;
  while (got < size) {
    const uint64_t left = size - got;
    const size_t piece = left < (uint64_t{1} << 30) ? static_cast<size_t>(left) : size_t{1} << 30;
    const ssize_t n = ::read(fd, out + got, piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      outcome = ReadOutcome::kFailed;
      break;
    }
    if (n == 0) {
      outcome = ReadOutcome::kShrank;
      break;
    }
    got += static_cast<uint64_t>(n);
  }
  if (outcome == ReadOutcome::kRead) {
    uint8_t extra;
    ssize_t n;
    do {
      n = ::read(fd, &extra, 1);
    } while (n < 0 && errno == EINTR);
    if (n > 0) outcome = ReadOutcome::kGrew;
    if (n < 0) {
      *error = errno;
      outcome = ReadOutcome::kFailed;
    }
  }
  *done = got;
  ::close(fd);
  return outcome;
}

}  // namespace files
}  // namespace imgops
