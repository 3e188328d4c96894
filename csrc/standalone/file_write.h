// An output file written whole and committed in one call, without Python between the steps:
// the bytes into a new temporary file beside the target, optionally fsync, then the temporary
// becomes the target (rename, or link + unlink where an existing target must not be replaced),
// optionally fsync of the folder. imgops.io.atomic names the temporary and keeps the books of
// the temporaries in flight (signal handlers remove them); this does the system calls, so a
// worker thread lets go of the GIL once per file instead of once per system call.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace imgops {
namespace files {

// What a failed write failed on: errno (0: nothing failed) and which path it was about.
enum class About { kTemporary, kTarget };
struct WriteError {
  int code = 0;
  About about = About::kTarget;
};

// fsync calls the writers made (files and folders), for tests that check --no-fsync.
inline std::atomic<uint64_t> fsync_calls{0};

inline int counted_fsync(int fd) {
  fsync_calls.fetch_add(1, std::memory_order_relaxed);
  return ::fsync(fd);
}

inline bool write_all(int fd, const uint8_t* data, size_t size) {
  while (size > 0) {
    const size_t piece = size < (size_t{1} << 30) ? size : (size_t{1} << 30);
    const ssize_t done = ::write(fd, data, piece);
    if (done < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (done == 0) {
      errno = EIO;  // a regular file that takes nothing: report it, never spin
      return false;
    }
    data += done;
    size -= static_cast<size_t>(done);
  }
  return true;
}

inline void fsync_folder_of(const std::string& target) {
  const size_t slash = target.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : target.substr(0, slash + 1);
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // not every file system lets a folder be opened or synced
  counted_fsync(fd);
  ::close(fd);
}

// The temporary (already written and closed) becomes the target. Without `overwrite` an
// existing target is never replaced: link() refuses it atomically (EEXIST); on file systems
// without hard links, a check then a rename (a small race, as imgops.io.atomic documents).
inline WriteError commit(const std::string& temp, const std::string& target, bool overwrite) {
  if (overwrite) {
    if (::rename(temp.c_str(), target.c_str()) != 0) return {errno, About::kTarget};
    return {};
  }
  if (::link(temp.c_str(), target.c_str()) == 0) {
    ::unlink(temp.c_str());
    return {};
  }
  const int code = errno;
  if (code == EEXIST) return {EEXIST, About::kTarget};
  struct stat info;
  if (::lstat(target.c_str(), &info) == 0) return {EEXIST, About::kTarget};
  if (::rename(temp.c_str(), target.c_str()) != 0) return {errno, About::kTarget};
  return {};
}

// Writes data[0..size) to `temp` (created; it must not exist), commits it onto `target` and
// returns no error, or removes the temporary and returns where it failed.
inline WriteError write_file_atomic(const uint8_t* data, size_t size, const std::string& temp,
                                    const std::string& target, bool overwrite, bool durable) {
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return {errno, About::kTemporary};
  WriteError error;
  if (!write_all(fd, data, size) || (durable && counted_fsync(fd) != 0)) error = {errno, About::kTarget};
  if (::close(fd) != 0 && error.code == 0) error = {errno, About::kTarget};
  if (error.code == 0) error = commit(temp, target, overwrite);
  if (error.code != 0) {
    ::unlink(temp.c_str());  // (error.code keeps the failure's errno)
    return error;
  }
  if (durable) fsync_folder_of(target);
  return {};
}

}  // namespace files
}  // namespace imgops
